#include "leanloader/pipeline/shard.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <set>
#include <vector>

#include "leanloader/core/error.h"
#include "leanloader/pipeline/sampler.h"

namespace leanloader {
namespace {

// Every rank's batches, as lists of global order positions.
using Batches = std::vector<std::vector<uint64_t>>;

std::vector<Batches> shard_all(uint64_t size, uint64_t batch, bool drop_last, uint64_t world,
                               uint64_t start = 0) {
  std::vector<Batches> out;
  for (uint64_t rank = 0; rank < world; ++rank) {
    const RankShard shard(size, batch, drop_last, rank, world, start);
    Batches batches;
    for (uint64_t p = 0; p < shard.num_positions(); ++p) {
      if (p % batch == 0) batches.emplace_back();
      batches.back().push_back(shard.order_position(p));
    }
    EXPECT_EQ(batches.size(), shard.num_batches());
    out.push_back(std::move(batches));
  }
  return out;
}

// The global batches in global order: batch k comes from rank k % world.
Batches interleave(const std::vector<Batches>& ranks) {
  Batches out;
  const size_t world = ranks.size();
  for (size_t local = 0; local < ranks[0].size(); ++local) {
    for (size_t rank = 0; rank < world; ++rank) out.push_back(ranks[rank][local]);
  }
  return out;
}

TEST(RankShardTest, SingleRankIsThePlainOrder) {
  for (const uint64_t size : {0, 1, 7, 64, 1000}) {
    for (const bool drop_last : {false, true}) {
      const RankShard shard(size, 16, drop_last, 0, 1);
      EXPECT_EQ(shard.num_batches(), drop_last ? size / 16 : (size + 15) / 16);
      EXPECT_EQ(shard.num_positions(), drop_last ? size / 16 * 16 : size);
      for (uint64_t p = 0; p < shard.num_positions(); ++p) EXPECT_EQ(shard.order_position(p), p);
    }
  }
}

TEST(RankShardTest, EveryPositionOnceAcrossRanksAndEqualBatchCounts) {
  for (const uint64_t size : {1, 5, 7, 10, 31, 64, 100, 1001}) {
    for (const uint64_t batch : {1, 3, 4, 16}) {
      for (const uint64_t world : {1, 2, 3, 5, 8}) {
        for (const bool drop_last : {false, true}) {
          SCOPED_TRACE(::testing::Message() << "size " << size << " batch " << batch << " world "
                                            << world << " drop_last " << drop_last);
          const auto ranks = shard_all(size, batch, drop_last, world);
          for (const Batches& r : ranks) EXPECT_EQ(r.size(), ranks[0].size());
          std::map<uint64_t, int> seen;
          uint64_t visits = 0;
          for (const Batches& r : ranks) {
            for (const auto& b : r) {
              for (const uint64_t p : b) {
                ASSERT_LT(p, size);
                ++seen[p];
                ++visits;
              }
            }
          }
          if (drop_last) {
            // Trimmed: no repeats, whole global batches, a multiple of world of them.
            const uint64_t kept = size / batch / world * world * batch;
            EXPECT_EQ(visits, kept);
            EXPECT_EQ(seen.size(), kept);
            for (const auto& [p, count] : seen) EXPECT_EQ(count, 1) << p;
          } else {
            // Padded: every position at least once; only the padding repeats.
            EXPECT_EQ(seen.size(), size);
            const uint64_t real_batches = (size + batch - 1) / batch;
            EXPECT_EQ(ranks[0].size(), (real_batches + world - 1) / world);
            const Batches global = interleave(ranks);
            std::set<uint64_t> real;
            for (uint64_t k = 0; k < real_batches; ++k) {
              for (const uint64_t p : global[k]) EXPECT_TRUE(real.insert(p).second) << p;
            }
            EXPECT_EQ(real.size(), size);
            for (uint64_t k = real_batches; k < global.size(); ++k) {
              EXPECT_EQ(global[k].size(), batch);  // padding batches are whole
            }
          }
        }
      }
    }
  }
}

TEST(RankShardTest, GlobalBatchesDoNotDependOnWorldSize) {
  for (const bool drop_last : {false, true}) {
    const uint64_t size = 103, batch = 4;
    const Batches one = interleave(shard_all(size, batch, drop_last, 1));
    for (const uint64_t world : {2, 3, 7}) {
      const Batches many = interleave(shard_all(size, batch, drop_last, world));
      const size_t common = std::min(one.size(), many.size());
      for (size_t k = 0; k < common; ++k) EXPECT_EQ(one[k], many[k]) << "batch " << k;
    }
  }
}

TEST(RankShardTest, ResumeContinuesTheGlobalOrderWithAnotherWorldSize) {
  const uint64_t size = 1001, batch = 8;
  for (const bool drop_last : {false, true}) {
    const Batches whole = interleave(shard_all(size, batch, drop_last, 1));
    for (const uint64_t saved_world : {1, 2, 3}) {
      const RankShard saver(size, batch, drop_last, 0, saved_world);
      for (const uint64_t steps :
           {uint64_t{0}, uint64_t{1}, uint64_t{7}, saver.num_batches() - 1}) {
        const uint64_t position = saver.global_position_after(steps);
        EXPECT_EQ(position, steps * saved_world * batch);
        for (const uint64_t world : {1, 2, 3, 4}) {
          const Batches rest = interleave(shard_all(size, batch, drop_last, world, position));
          const uint64_t first = position / batch;
          // The global batches of the resumed run are the uninterrupted ones
          // from the saved position on (padding aside).
          const uint64_t real = drop_last ? size / batch : (size + batch - 1) / batch;
          for (uint64_t k = 0;
               k < rest.size() && first + k < std::min<uint64_t>(real, whole.size()); ++k) {
            EXPECT_EQ(rest[k], whole[first + k]) << "world " << world << " batch " << k;
          }
          // With the saver's world size nothing is lost or added.
          if (world == saved_world) {
            const Batches saved = interleave(shard_all(size, batch, drop_last, world));
            EXPECT_EQ(rest.size() + steps * world, saved.size());
          }
        }
      }
      EXPECT_EQ(saver.global_position_after(saver.num_batches()), size);
    }
  }
}

TEST(RankShardTest, RejectsBadArguments) {
  EXPECT_THROW(RankShard(10, 0, false, 0, 1), InvalidArgument);
  EXPECT_THROW(RankShard(10, 2, false, 0, 0), InvalidArgument);
  EXPECT_THROW(RankShard(10, 2, false, 2, 2), InvalidArgument);
  EXPECT_THROW(RankShard(10, 2, false, 0, 1, 11), InvalidArgument);
  EXPECT_THROW(RankShard(uint64_t{1} << 62, uint64_t{1} << 62, false, 0, 8), InvalidArgument);
}

// 1,024 ranks over 10^9 samples: each rank's first batch from its shard and
// the epoch's permutation alone (a few words of state, no per-sample memory),
// pairwise disjoint on a sample of ranks.
TEST(RankShardTest, ThousandRanksOverABillionSamples) {
  const uint64_t size = 1'000'000'000, batch = 256, world = 1024;
  const Sampler sampler(size, true, 1234);
  static_assert(sizeof(RankShard) <= 128, "a shard is a handful of integers");
  static_assert(sizeof(Permutation) <= 128, "a permutation is a handful of integers");
  std::set<uint64_t> seen;
  std::vector<uint64_t> first(batch);  // the batch itself: the only per-rank memory
  double compute_seconds = 0;
  uint64_t ranks_checked = 0;
  for (uint64_t rank = 0; rank < world; rank += 7) {  // a sample of ranks (147 of them)
    const auto started = std::chrono::steady_clock::now();
    const RankShard shard(size, batch, false, rank, world);
    const Permutation permutation = sampler.permutation(3);
    for (uint64_t p = 0; p < batch; ++p) first[p] = permutation(shard.order_position(p));
    compute_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    ASSERT_EQ(shard.num_batches(), (size / batch + world - 1) / world);
    for (uint64_t p = 0; p < batch; ++p) {
      ASSERT_LT(first[p], size);
      ASSERT_TRUE(seen.insert(first[p]).second) << "rank " << rank << " position " << p;
    }
    ++ranks_checked;
  }
  const double seconds = compute_seconds;
  EXPECT_EQ(seen.size(), ranks_checked * batch);
  std::printf(
      "[ RankShard ] %llu ranks of 1024 over 1e9 samples: first batch of %llu indices "
      "in %.2f us per rank\n",
      static_cast<unsigned long long>(ranks_checked), static_cast<unsigned long long>(batch),
      seconds * 1e6 / double(ranks_checked));
  RecordProperty("us_per_rank", std::to_string(seconds * 1e6 / double(ranks_checked)));
}

}  // namespace
}  // namespace leanloader
