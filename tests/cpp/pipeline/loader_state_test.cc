// Loader sharding (rank, world_size) and resumable state.
#include <gtest/gtest.h>

#include <chrono>
#include <set>
#include <vector>

#include "leanloader/core/error.h"
#include "leanloader/pipeline/loader.h"
#include "leanloader/sources/array_source.h"

namespace leanloader {
namespace {

using namespace std::chrono_literals;

// An ArraySource of `size` samples with one int64 field "id" = index.
std::shared_ptr<ArraySource> ids(int64_t size, const std::string& name = "id") {
  auto storage = HeapStorage::allocate(static_cast<size_t>(std::max<int64_t>(size, 1)) * 8);
  for (int64_t i = 0; i < size; ++i) reinterpret_cast<int64_t*>(storage->data())[i] = i;
  return std::make_shared<ArraySource>(
      std::vector<ArraySource::Field>{{name, Tensor(storage, 0, DType::kI64, {size})}});
}

LoaderOptions sharded(int64_t batch, bool drop_last, uint64_t rank, uint64_t world) {
  LoaderOptions o;
  o.batch_size = batch;
  o.shuffle = true;
  o.seed = 7;
  o.num_threads = 2;
  o.drop_last = drop_last;
  o.rank = rank;
  o.world_size = world;
  return o;
}

// The ids of the next `count` batches (all of them when count < 0), read
// from the batch data itself.
std::vector<std::vector<int64_t>> take(EpochIterator& it, int64_t count = -1) {
  std::vector<std::vector<int64_t>> out;
  Batch batch;
  while (count < 0 || static_cast<int64_t>(out.size()) < count) {
    const auto status = it.next(batch, 10s);
    if (status == EpochIterator::Status::kEnd) break;
    EXPECT_EQ(status, EpochIterator::Status::kBatch);
    const auto* v = reinterpret_cast<const int64_t*>(batch.stacked[0].data());
    out.emplace_back(v, v + batch.stacked[0].shape()[0]);
    EXPECT_EQ(out.back(), batch.indices);
  }
  return out;
}

TEST(LoaderShardTest, ThreeRanksCoverAnOddSizeOnce) {
  const int64_t size = 100;  // not divisible by 3, nor by batch x 3
  for (const bool drop_last : {false, true}) {
    auto source = ids(size);
    std::vector<std::vector<std::vector<int64_t>>> ranks;
    for (uint64_t r = 0; r < 3; ++r) {
      Loader loader(source, sharded(8, drop_last, r, 3));
      auto it = loader.iterate();
      ranks.push_back(take(*it));
      EXPECT_EQ(static_cast<int64_t>(ranks.back().size()), loader.num_batches());
    }
    std::multiset<int64_t> all;
    for (const auto& r : ranks) {
      EXPECT_EQ(r.size(), ranks[0].size());  // equal steps on every rank
      for (const auto& b : r) all.insert(b.begin(), b.end());
    }
    if (drop_last) {
      // 12 full batches, trimmed to 12 (a multiple of 3): 96 distinct samples.
      EXPECT_EQ(all.size(), 96u);
      EXPECT_EQ(std::set<int64_t>(all.begin(), all.end()).size(), all.size());
    } else {
      // 13 batches padded to 15 by wrapping: every sample, 20 repeats.
      EXPECT_EQ(std::set<int64_t>(all.begin(), all.end()).size(), static_cast<size_t>(size));
      EXPECT_EQ(all.size(), 4u + 14u * 8u);  // 13th batch short (4 rows), 2 padding batches
    }
  }
}

TEST(LoaderStateTest, ResumeGivesTheRestOfTheUninterruptedRun) {
  const int64_t size = 203;
  auto source = ids(size);
  for (const bool drop_last : {false, true}) {
    Loader reference(source, sharded(10, drop_last, 0, 1));
    reference.set_epoch(2);
    auto it = reference.iterate();
    const auto whole = take(*it);
    for (const int64_t k :
         {int64_t{0}, int64_t{1}, int64_t{9}, static_cast<int64_t>(whole.size()) - 1,
          static_cast<int64_t>(whole.size())}) {
      Loader first(source, sharded(10, drop_last, 0, 1));
      first.set_epoch(2);
      auto run = first.iterate();
      EXPECT_EQ(take(*run, k), std::vector(whole.begin(), whole.begin() + k));
      const LoaderState state = first.state();
      if (k == static_cast<int64_t>(whole.size())) {
        EXPECT_EQ(state.epoch, 3u);  // the pass is complete: the next epoch, from 0
        EXPECT_EQ(state.position, 0u);
      } else {
        EXPECT_EQ(state.epoch, 2u);
        EXPECT_EQ(state.position, static_cast<uint64_t>(k * 10));
      }
      Loader second(source, sharded(10, drop_last, 0, 1));
      second.load_state(state);
      EXPECT_EQ(second.epoch(), state.epoch);
      EXPECT_EQ(second.state().position, state.position);
      auto rest = second.iterate();
      if (state.epoch == 2) {
        EXPECT_EQ(take(*rest), std::vector(whole.begin() + k, whole.end())) << "k " << k;
      }
    }
  }
}

TEST(LoaderStateTest, SetEpochAfterLeavingAPassEarlyIsWhereTheLoaderStands) {
  // A training loop leaves epoch 0 after 3 steps and calls set_epoch(1): the
  // state said epoch 0 at position 12 (the loader's own advance after a pass
  // is also to epoch 1, and the call was not told apart from it), so a job
  // resumed from it replayed the rest of epoch 0.
  auto source = ids(40);
  Loader loader(source, sharded(4, false, 0, 1));
  loader.set_epoch(0);
  {
    auto run = loader.iterate();
    ASSERT_EQ(take(*run, 3).size(), 3u);
    EXPECT_EQ(loader.state().epoch, 0u);  // without a call, the pass left is where it stands
    EXPECT_EQ(loader.state().position, 12u);
  }
  loader.set_epoch(1);
  const LoaderState state = loader.state();
  EXPECT_EQ(state.epoch, 1u);
  EXPECT_EQ(state.position, 0u);
  Loader resumed(source, sharded(4, false, 0, 1));
  resumed.load_state(state);
  Loader reference(source, sharded(4, false, 0, 1));
  reference.set_epoch(1);
  auto want = reference.iterate();
  auto got = resumed.iterate();
  EXPECT_EQ(take(*got), take(*want));
}

TEST(LoaderStateTest, ElasticResumeFromTwoRanksToThree) {
  const int64_t size = 301;
  auto source = ids(size);
  // Uninterrupted, one rank: the global batch order.
  Loader reference(source, sharded(6, false, 0, 1));
  auto ref_it = reference.iterate();
  const auto global = take(*ref_it);
  // Two ranks take 4 steps each (global batches 0..7), then save.
  LoaderState state;
  std::set<int64_t> consumed;
  for (uint64_t r = 0; r < 2; ++r) {
    Loader loader(source, sharded(6, false, r, 2));
    auto it = loader.iterate();
    for (const auto& b : take(*it, 4)) consumed.insert(b.begin(), b.end());
    state = loader.state();
  }
  EXPECT_EQ(state.position, 48u);
  EXPECT_EQ(state.world_size, 2u);
  // Three ranks continue: global batches 8, 9, 10, ... round-robin.
  std::vector<std::vector<std::vector<int64_t>>> ranks;
  for (uint64_t r = 0; r < 3; ++r) {
    Loader loader(source, sharded(6, false, r, 3));
    loader.load_state(state);
    auto it = loader.iterate();
    ranks.push_back(take(*it));
  }
  std::set<int64_t> rest;
  for (size_t local = 0; local < ranks[0].size(); ++local) {
    for (size_t r = 0; r < 3; ++r) {
      const size_t k = 8 + local * 3 + r;
      if (k >= global.size()) continue;  // padding
      EXPECT_EQ(ranks[r][local], global[k]) << "global batch " << k;
      for (const int64_t i : ranks[r][local]) {
        EXPECT_TRUE(rest.insert(i).second);
      }
    }
  }
  // Exactly once over the epoch: what was consumed before plus the rest.
  for (const int64_t i : rest) EXPECT_FALSE(consumed.count(i)) << i;
  EXPECT_EQ(consumed.size() + rest.size(), static_cast<size_t>(size));
}

TEST(LoaderStateTest, AnotherBatchSizeContinuesFromTheSamplePosition) {
  auto source = ids(97);
  Loader reference(source, sharded(1, false, 0, 1));
  std::vector<int64_t> order;
  auto ref_it = reference.iterate();
  for (const auto& b : take(*ref_it)) order.insert(order.end(), b.begin(), b.end());
  Loader first(source, sharded(10, false, 0, 1));
  auto it = first.iterate();
  take(*it, 3);
  const LoaderState state = first.state();
  EXPECT_EQ(state.position, 30u);
  // Resumed with batches of 8 (30 is not a multiple of 8): the rest of the
  // same order, cut from sample 30 on.
  Loader second(source, sharded(8, false, 0, 1));
  second.load_state(state);
  auto rest_it = second.iterate();
  std::vector<int64_t> rest;
  const auto batches = take(*rest_it);
  for (const auto& b : batches) rest.insert(rest.end(), b.begin(), b.end());
  EXPECT_EQ(batches.size(), 9u);  // 67 samples: 8 full batches and one of 3
  EXPECT_EQ(rest, std::vector<int64_t>(order.begin() + 30, order.end()));
}

TEST(LoaderStateTest, RejectsAStateOfAnotherSourceOrOrder) {
  Loader loader(ids(50), sharded(5, false, 0, 1));
  const LoaderState state = loader.state();
  Loader other(ids(50, "label"), sharded(5, false, 0, 1));
  try {
    other.load_state(state);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("another source"), std::string::npos) << e.what();
  }
  LoaderOptions reseeded = sharded(5, false, 0, 1);
  reseeded.seed = 8;
  Loader reordered(ids(50), reseeded);
  EXPECT_THROW(reordered.load_state(state), InvalidArgument);
  LoaderState past = state;
  past.position = 51;
  EXPECT_THROW(loader.load_state(past), InvalidArgument);
  LoaderOptions bad = sharded(5, false, 3, 3);
  EXPECT_THROW(Loader(ids(50), bad), InvalidArgument);
}

TEST(LoaderStateTest, RestoreIsConstantTime) {
  // 10^9 samples viewed from one broadcast row: nothing is read, only planned.
  auto storage = HeapStorage::allocate(8);
  const int64_t size = 1'000'000'000;
  auto source = std::make_shared<ArraySource>(
      std::vector<ArraySource::Field>{{"x", Tensor(storage, 0, DType::kI64, {size}, {0})}});
  Loader loader(source, sharded(256, false, 0, 8));
  LoaderState state = loader.state();
  state.epoch = 5;
  state.position = 123'456'768;
  const auto started = std::chrono::steady_clock::now();
  loader.load_state(state);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  EXPECT_EQ(loader.state().position, state.position);
  EXPECT_EQ(loader.epoch(), 5u);
  EXPECT_LT(seconds, 0.01);
  loader.set_epoch(6);  // another epoch: the loaded position no longer applies
  EXPECT_EQ(loader.state().epoch, 6u);
  EXPECT_EQ(loader.state().position, 0u);
  loader.set_epoch(5);  // and set back, still dropped: the pass starts at 0
  EXPECT_EQ(loader.state().position, 0u);
  loader.load_state(state);
  loader.set_epoch(5);  // its own epoch keeps it
  EXPECT_EQ(loader.state().position, state.position);
  std::printf("[ LoaderState ] load_state over 1e9 samples: %.2f us\n", seconds * 1e6);
}

}  // namespace
}  // namespace leanloader
