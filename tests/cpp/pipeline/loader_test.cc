#include "leanloader/pipeline/loader.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <mutex>
#include <set>
#include <thread>

#include "io/streaming_copy.h"
#include "leanloader/core/error.h"
#include "leanloader/sources/array_source.h"
#include "leanloader/sources/file_source.h"
#include "leanloader/sources/npy_source.h"
#include "test_util.h"

namespace leanloader {
namespace {

using namespace std::chrono_literals;
using testing::id_source;
using testing::TempDir;
using testing::write_npy;

// Runs one pass and returns every batch.
std::vector<Batch> run_epoch(Loader& loader) {
  auto iterator = loader.iterate();
  std::vector<Batch> batches;
  Batch batch;
  while (true) {
    const auto status = iterator->next(batch, 10s);
    if (status == EpochIterator::Status::kEnd) break;
    EXPECT_EQ(status, EpochIterator::Status::kBatch);
    batches.push_back(std::move(batch));
  }
  return batches;
}

std::vector<int64_t> ids_of(const std::vector<Batch>& batches) {
  std::vector<int64_t> ids;
  for (const Batch& batch : batches) {
    const Tensor& id = batch.stacked[0];
    const auto* values = reinterpret_cast<const int64_t*>(id.data());
    ids.insert(ids.end(), values, values + id.shape()[0]);
  }
  return ids;
}

LoaderOptions options(int64_t batch_size, bool shuffle, int threads, bool drop_last = false) {
  LoaderOptions o;
  o.batch_size = batch_size;
  o.shuffle = shuffle;
  o.num_threads = threads;
  o.drop_last = drop_last;
  return o;
}

TEST(LoaderTest, EveryIndexExactlyOncePerEpoch) {
  for (const int64_t size : {1, 7, 64, 1000}) {
    for (const bool shuffle : {false, true}) {
      for (const bool drop_last : {false, true}) {
        Loader loader(id_source(size), options(16, shuffle, 2, drop_last));
        const auto batches = run_epoch(loader);
        std::vector<int64_t> ids = ids_of(batches);
        const int64_t expected = drop_last ? size / 16 * 16 : size;
        ASSERT_EQ(static_cast<int64_t>(ids.size()), expected) << size << shuffle << drop_last;
        ASSERT_EQ(static_cast<int64_t>(batches.size()), loader.num_batches());
        if (!drop_last) {
          std::sort(ids.begin(), ids.end());
          for (int64_t i = 0; i < size; ++i) ASSERT_EQ(ids[static_cast<size_t>(i)], i);
        } else {
          ASSERT_EQ(std::set<int64_t>(ids.begin(), ids.end()).size(), ids.size());
        }
        if (!shuffle) {
          EXPECT_TRUE(std::is_sorted(ids.begin(), ids.end()));
        }
      }
    }
  }
}

// Small rows are claimed in chunks, not one by one: a claim takes the run's
// lock twice and updates shared counters, as costly as copying a 4 KiB row.
TEST(LoaderTest, SmallRowsAreClaimedInChunks) {
  const int64_t samples = 16384;
  Loader loader(id_source(samples), options(1024, true, 2));  // 24-byte rows
  const auto batches = run_epoch(loader);
  ASSERT_EQ(ids_of(batches).size(), static_cast<size_t>(samples));
  const LoaderStats stats = loader.stats();
  EXPECT_EQ(stats.samples_read, static_cast<uint64_t>(samples));
  EXPECT_LE(stats.work_claims, static_cast<uint64_t>(samples / 64 + loader.num_batches()));
}

TEST(LoaderTest, RowsMatchTheirSamples) {
  Loader loader(id_source(100), options(8, true, 2));
  for (const Batch& batch : run_epoch(loader)) {
    const auto* ids = reinterpret_cast<const int64_t*>(batch.stacked[0].data());
    const auto* xs = reinterpret_cast<const float*>(batch.stacked[1].data());
    EXPECT_EQ(batch.stacked[1].shape(), (Shape{batch.stacked[0].shape()[0], 4}));
    for (int64_t r = 0; r < batch.stacked[0].shape()[0]; ++r) {
      EXPECT_EQ(xs[r * 4 + 3], float(ids[r] * 10 + 3));
      EXPECT_EQ(batch.indices[static_cast<size_t>(r)], ids[r]);
    }
  }
}

TEST(LoaderTest, OrderDoesNotDependOnThreadCount) {
  std::vector<int64_t> reference;
  for (const int threads : {1, 2, 8}) {
    Loader loader(id_source(500), options(32, true, threads));
    loader.set_epoch(3);
    const auto ids = ids_of(run_epoch(loader));
    if (reference.empty()) {
      reference = ids;
    } else {
      EXPECT_EQ(ids, reference) << threads << " threads";
    }
  }
}

TEST(LoaderTest, EpochAndSeedChangeTheOrder) {
  Loader loader(id_source(200), options(10, true, 2));
  const auto epoch0 = ids_of(run_epoch(loader));
  const auto epoch1 = ids_of(run_epoch(loader));  // iterate() advanced the epoch
  EXPECT_NE(epoch0, epoch1);
  loader.set_epoch(0);
  EXPECT_EQ(ids_of(run_epoch(loader)), epoch0);
  LoaderOptions other = options(10, true, 2);
  other.seed = 99;
  Loader reseeded(id_source(200), other);
  EXPECT_NE(ids_of(run_epoch(reseeded)), epoch0);
}

TEST(LoaderTest, TensorsViewPoolSlotsAndSlotsAreReused) {
  Loader loader(id_source(256), options(32, true, 2));
  std::set<const std::byte*> slot_addresses;
  for (int epoch = 0; epoch < 30; ++epoch) {
    auto iterator = loader.iterate();
    Batch batch;
    while (iterator->next(batch, 10s) == EpochIterator::Status::kBatch) {
      for (const Tensor& tensor : batch.stacked) {
        const Storage& slot = *tensor.storage();
        ASSERT_EQ(slot.kind(), StorageKind::kPoolSlot);
        ASSERT_GE(tensor.data(), slot.data());
        ASSERT_LE(tensor.data() + tensor.nbytes(), slot.data() + slot.size());
        slot_addresses.insert(slot.data());
      }
    }
  }
  // 30 epochs x 8 batches used only the planned slots: no allocation per batch.
  EXPECT_LE(slot_addresses.size(), loader.num_slots());
  const LoaderStats stats = loader.stats();
  EXPECT_EQ(stats.overflow_slots_total, 0u);
  EXPECT_LE(stats.resident_bytes, loader.memory_bill());  // slots are created on first use
  EXPECT_EQ(stats.batches_delivered, 240u);
}

TEST(LoaderTest, ConsumerHoldingEveryBatchOverflowsWithOneWarning) {
  Loader loader(id_source(100), options(10, false, 2));
  const auto batches = run_epoch(loader);  // all ten batches kept alive
  ASSERT_EQ(batches.size(), 10u);
  EXPECT_EQ(ids_of(batches).size(), 100u);
  size_t warnings = 0;
  for (const Batch& batch : batches) warnings += batch.warnings.size();
  EXPECT_EQ(warnings, 1u);
  EXPECT_GT(loader.stats().overflow_slots_total, 0u);
}

TEST(LoaderTest, MemoryBudgetCapsSlots) {
  Loader unlimited(id_source(100), options(10, false, 1));
  const size_t slot = unlimited.slot_bytes();
  LoaderOptions capped = options(10, false, 1);
  capped.prefetch = 4;
  capped.memory_budget = slot * 3;
  Loader loader(id_source(100), capped);
  EXPECT_EQ(loader.num_slots(), 3u);
  EXPECT_EQ(loader.effective_prefetch(), 1);
  EXPECT_LE(loader.memory_bill(), *capped.memory_budget);
  EXPECT_EQ(ids_of(run_epoch(loader)).size(), 100u);
  capped.memory_budget = slot;
  try {
    Loader too_small(id_source(100), capped);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("memory_budget"), std::string::npos);
  }
}

// A directory of per-sample .npy files where the files at `bad` are truncated.
std::shared_ptr<NpySource> directory_with_bad_files(const TempDir& dir, int count,
                                                    const std::set<int>& bad) {
  for (int i = 0; i < count; ++i) {
    char name[32];
    std::snprintf(name, sizeof(name), "s%04d.npy", i);
    std::vector<int32_t> values(8, i);
    if (bad.count(i)) {
      write_npy(dir.file(name), DType::kI32, {8}, values.data(), 12);  // 12 of 32 bytes
    } else {
      write_npy(dir.file(name), DType::kI32, {8}, values);
    }
  }
  return NpySource::from_directory("v", dir.path());
}

TEST(LoaderTest, WorkerErrorSurfacesOnceWithSampleContext) {
  TempDir dir;
  Loader loader(directory_with_bad_files(dir, 40, {17}), options(5, false, 2));
  auto iterator = loader.iterate();
  Batch batch;
  int delivered = 0;
  try {
    while (iterator->next(batch, 10s) == EpochIterator::Status::kBatch) ++delivered;
    FAIL() << "no error raised";
  } catch (const SampleError& e) {
    EXPECT_EQ(e.sample_index(), 17);
    EXPECT_EQ(e.stage(), "read");
    EXPECT_EQ(e.kind(), ErrorKind::kFormat);
    EXPECT_NE(std::string(e.what()).find("s0017.npy"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("sample 17"), std::string::npos) << e.what();
  }
  EXPECT_EQ(delivered, 3);  // batches 0..2 precede the bad sample's batch
  EXPECT_EQ(iterator->next(batch, 1s), EpochIterator::Status::kEnd);  // raised once
}

TEST(LoaderTest, SkipDropsBadSamplesAndCountsThem) {
  TempDir dir;
  LoaderOptions o = options(10, true, 2);
  o.on_error = OnError::kSkip;
  o.max_skip_fraction = 0.05;
  Loader loader(directory_with_bad_files(dir, 100, {3, 50}), o);
  auto iterator = loader.iterate();
  Batch batch;
  std::vector<int64_t> seen;
  while (iterator->next(batch, 10s) == EpochIterator::Status::kBatch) {
    const auto* values = reinterpret_cast<const int32_t*>(batch.stacked[0].data());
    for (int64_t r = 0; r < batch.stacked[0].shape()[0]; ++r) {
      // Compaction kept rows and indices aligned.
      EXPECT_EQ(values[r * 8], batch.indices[static_cast<size_t>(r)]);
      seen.push_back(values[r * 8]);
    }
  }
  EXPECT_EQ(seen.size(), 98u);
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 3), 0);
  EXPECT_EQ(iterator->skipped_count(), 2u);
  ASSERT_EQ(iterator->skipped().size(), 2u);
  EXPECT_EQ(loader.stats().samples_skipped, 2u);
}

// Samples 4-7 and 12-15 warn, then fail: with batches of 4, two whole
// batches of bad samples.
class HalfBadSource final : public Source {
 public:
  int64_t size() const override { return 16; }
  const std::vector<FieldSpec>& fields() const override { return fields_; }
  void read_sample(int64_t index, SampleWriter& writer) const override {
    if ((index / 4) % 2 == 1) {
      writer.warn(Warning("sample " + std::to_string(index) + " warns"));
      throw FormatError("sample " + std::to_string(index) + " is bad");
    }
    std::span<std::byte> row = writer.field_buffer(0, *fields_[0].shape);
    *reinterpret_cast<int32_t*>(row.data()) = static_cast<int32_t>(index);
  }
  std::string describe() const override { return "HalfBadSource"; }
  std::string sample_location(int64_t index) const override { return std::to_string(index); }
  size_t estimated_sample_bytes() const override { return 4; }

 private:
  std::vector<FieldSpec> fields_{{"x", DType::kI32, Shape{}}};
};

TEST(LoaderTest, ABatchWhoseEverySampleWasSkippedIsNotDelivered) {
  // An empty batch reached the consumer (a loss averaged over no samples is
  // NaN). It is passed over; its warnings come with the next batch, or at
  // the end of the pass.
  LoaderOptions o = options(4, false, 2);
  o.on_error = OnError::kSkip;
  o.max_skip_fraction = 0.5;
  Loader loader(std::make_shared<HalfBadSource>(), o);
  auto iterator = loader.iterate();
  Batch batch;
  std::vector<std::vector<int64_t>> indices;
  std::vector<size_t> warnings;
  while (iterator->next(batch, 10s) == EpochIterator::Status::kBatch) {
    indices.push_back(batch.indices);
    warnings.push_back(batch.warnings.size());
  }
  EXPECT_EQ(indices, (std::vector<std::vector<int64_t>>{{0, 1, 2, 3}, {8, 9, 10, 11}}));
  EXPECT_EQ(warnings, (std::vector<size_t>{0, 4}));
  const std::vector<Warning> left = iterator->take_warnings();
  ASSERT_EQ(left.size(), 4u);
  std::set<std::string> messages;
  for (const Warning& warning : left) messages.insert(warning.message);
  EXPECT_EQ(messages, (std::set<std::string>{"sample 12 warns", "sample 13 warns",
                                             "sample 14 warns", "sample 15 warns"}));
  EXPECT_TRUE(iterator->take_warnings().empty());
  EXPECT_EQ(iterator->skipped_count(), 8u);
  // The passed-over batches count as delivered: a state saved now is at the
  // pass's end, not before its last batch.
  EXPECT_EQ(loader.stats().batches_delivered, 4u);
  // Sharded over ranks, each rank takes every step (a rank with fewer would
  // leave the others waiting in their collectives): rank 1's batches (global
  // batches 1 and 3, every sample bad) arrive empty.
  for (uint64_t rank = 0; rank < 2; ++rank) {
    LoaderOptions sharded = o;
    sharded.world_size = 2;
    sharded.rank = rank;
    sharded.max_skip_fraction = 1.0;  // rank 1 has no good sample
    Loader ranked(std::make_shared<HalfBadSource>(), sharded);
    auto pass = ranked.iterate();
    std::vector<size_t> rows;
    while (pass->next(batch, 10s) == EpochIterator::Status::kBatch) {
      rows.push_back(batch.indices.size());
    }
    EXPECT_EQ(rows, (rank == 0 ? std::vector<size_t>{4, 4} : std::vector<size_t>{0, 0})) << rank;
  }
}

// Counts Source::pass_ended calls.
class PassEndCountingSource final : public Source {
 public:
  int64_t size() const override { return 10; }
  const std::vector<FieldSpec>& fields() const override { return fields_; }
  void read_sample(int64_t index, SampleWriter& writer) const override {
    *reinterpret_cast<int32_t*>(writer.field_buffer(0, *fields_[0].shape).data()) =
        static_cast<int32_t>(index);
  }
  std::string describe() const override { return "PassEndCountingSource"; }
  std::string sample_location(int64_t index) const override { return std::to_string(index); }
  size_t estimated_sample_bytes() const override { return 4; }
  void pass_ended() const noexcept override { ++ended; }
  mutable std::atomic<int> ended{0};

 private:
  std::vector<FieldSpec> fields_{{"x", DType::kI32, Shape{}}};
};

TEST(LoaderTest, TheSourceIsToldOnceWhenAPassEnds) {
  // HDF5Source closes the files it opened through the library then, so that
  // h5py in the same process can open them for writing between passes.
  auto source = std::make_shared<PassEndCountingSource>();
  Loader loader(source, options(3, true, 2));
  Batch batch;
  {
    auto iterator = loader.iterate();
    int batches = 0;
    while (iterator->next(batch, 10s) == EpochIterator::Status::kBatch) {
      EXPECT_EQ(source->ended.load(), 0) << "told before the pass's last batch";
      ++batches;
    }
    EXPECT_EQ(batches, 4);
    EXPECT_EQ(source->ended.load(), 1);
    EXPECT_EQ(iterator->next(batch, 1s), EpochIterator::Status::kEnd);
  }
  EXPECT_EQ(source->ended.load(), 1);  // once, though the end was seen twice and it was dropped
  {
    auto iterator = loader.iterate();  // a pass left after its first batch
    ASSERT_EQ(iterator->next(batch, 10s), EpochIterator::Status::kBatch);
  }
  EXPECT_EQ(source->ended.load(), 2);
}

TEST(LoaderTest, SkipRaisesPastMaxSkipFraction) {
  TempDir dir;
  LoaderOptions o = options(10, false, 2);
  o.on_error = OnError::kSkip;
  o.max_skip_fraction = 0.05;
  Loader loader(directory_with_bad_files(dir, 100, {1, 2, 3, 4, 5, 6}), o);
  auto iterator = loader.iterate();
  Batch batch;
  try {
    while (iterator->next(batch, 10s) == EpochIterator::Status::kBatch) {
    }
    FAIL() << "no error past max_skip_fraction";
  } catch (const SampleError& e) {
    EXPECT_NE(std::string(e.what()).find("max_skip_fraction"), std::string::npos) << e.what();
  }
}

TEST(LoaderTest, StackingDifferentShapesNamesTheFix) {
  TempDir dir;
  write_npy(dir.file("a.npy"), DType::kI32, {2}, std::vector<int32_t>{1, 2});
  write_npy(dir.file("b.npy"), DType::kI32, {3}, std::vector<int32_t>{1, 2, 3});
  Loader loader(NpySource::from_directory("v", dir.path()), options(2, false, 1));
  try {
    run_epoch(loader);
    FAIL();
  } catch (const SampleError& e) {
    EXPECT_EQ(e.sample_index(), 1);
    EXPECT_NE(std::string(e.what()).find("collate='list'"), std::string::npos) << e.what();
  }
}

TEST(LoaderTest, ListCollateYieldsVariableLengthFiles) {
  TempDir dir;
  std::vector<std::string> paths;
  for (int i = 0; i < 9; ++i) {
    paths.push_back(dir.file("f" + std::to_string(i)));
    std::ofstream(paths.back(), std::ios::binary)
        << std::string(static_cast<size_t>(i * 100), char('a' + i));
  }
  LoaderOptions o = options(4, false, 2);
  EXPECT_THROW(Loader(std::make_shared<FileSource>(paths), o), InvalidArgument);
  o.collate = Collate::kList;
  Loader loader(std::make_shared<FileSource>(paths), o);
  const auto batches = run_epoch(loader);
  ASSERT_EQ(batches.size(), 3u);
  int i = 0;
  for (const Batch& batch : batches) {
    for (const Tensor& bytes : batch.listed[0]) {
      ASSERT_EQ(bytes.shape(), (Shape{i * 100}));
      if (i > 0) {
        EXPECT_EQ(static_cast<char>(bytes.data()[i * 100 - 1]), char('a' + i));
      }
      ++i;
    }
  }
  EXPECT_EQ(i, 9);
}

TEST(LoaderTest, NewIterationMidEpochStartsCleanly) {
  Loader loader(id_source(300), options(10, true, 2));
  auto first = loader.iterate();
  Batch batch;
  ASSERT_EQ(first->next(batch, 10s), EpochIterator::Status::kBatch);
  ASSERT_EQ(first->next(batch, 10s), EpochIterator::Status::kBatch);
  batch = Batch{};
  loader.set_epoch(0);
  const auto batches = run_epoch(loader);
  const auto ids = ids_of(batches);
  EXPECT_EQ(ids.size(), 300u);
  EXPECT_EQ(std::set<int64_t>(ids.begin(), ids.end()).size(), 300u);
  EXPECT_THROW(first->next(batch, 1s), Error);  // the old pass was cancelled
}

TEST(LoaderTest, CloseWhileWorkersWaitForTheConsumerIsPrompt) {
  Loader loader(id_source(10000), options(10, false, 2));
  auto iterator = loader.iterate();
  Batch batch;
  ASSERT_EQ(iterator->next(batch, 10s), EpochIterator::Status::kBatch);
  std::this_thread::sleep_for(50ms);  // workers fill the window and block
  const auto started = std::chrono::steady_clock::now();
  EXPECT_TRUE(loader.close());
  EXPECT_LT(std::chrono::steady_clock::now() - started, 1s);
}

TEST(LoaderTest, CloseWhileAWorkerIsBlockedInAReadReturnsWithinASecond) {
  TempDir dir;
  const std::string fifo = dir.file("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  LoaderOptions o = options(1, false, 1);
  o.collate = Collate::kList;
  {
    Loader loader(std::make_shared<FileSource>(std::vector<std::string>{fifo}), o);
    auto iterator = loader.iterate();
    Batch batch;
    EXPECT_EQ(iterator->next(batch, 100ms), EpochIterator::Status::kTimeout);
    const auto started = std::chrono::steady_clock::now();
    EXPECT_FALSE(loader.close());  // the blocked thread had to be detached
    EXPECT_LT(std::chrono::steady_clock::now() - started, 1500ms);
  }
  // Unblock the detached thread so it can finish and free its state.
  const int fd = ::open(fifo.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  ::close(fd);
  std::this_thread::sleep_for(200ms);
}

TEST(LoaderTest, ABatchSizeWhoseSlotOverflowsIsAnErrorNotAWrappedSlot) {
  // Rows of 1 MiB: 2^45 of them need 2^65 bytes, which wrapped to a tiny slot
  // that rows were then written past.
  auto bytes = HeapStorage::allocate(size_t{1} << 20);
  auto source = std::make_shared<ArraySource>(
      std::vector<ArraySource::Field>{{"x", Tensor(bytes, 0, DType::kU8, {1, int64_t{1} << 20})}});
  for (const Collate collate : {Collate::kStack, Collate::kList}) {
    LoaderOptions o = options(int64_t{1} << 45, false, 1);
    o.collate = collate;
    try {
      Loader loader(source, o);
      FAIL() << "expected an InvalidArgument for the overflowing slot";
    } catch (const InvalidArgument& error) {
      EXPECT_NE(std::string(error.what()).find("lower batch_size"), std::string::npos)
          << error.what();
    }
  }
}

TEST(LoaderTest, BacksOffUnderMemoryPressureAndRecovers) {
  std::atomic<size_t> available{size_t{1} << 40};
  LoaderOptions o = options(10, false, 2);
  o.prefetch = 3;
  o.adaptive_prefetch = false;  // the depth is 3 from the start
  o.pressure_threshold = size_t{1} << 30;
  o.available_memory = [&] { return available.load(); };
  Loader loader(id_source(2000), o);
  EXPECT_EQ(loader.stats().window, 3);
  available = size_t{1} << 20;  // 1 MiB left: pressure
  auto iterator = loader.iterate();
  Batch batch;
  ASSERT_EQ(iterator->next(batch, 10s), EpochIterator::Status::kBatch);
  ASSERT_EQ(batch.warnings.size(), 1u);  // said once
  EXPECT_NE(batch.warnings[0].message.find("memory pressure"), std::string::npos)
      << batch.warnings[0].message;
  LoaderStats stats = loader.stats();
  EXPECT_TRUE(stats.under_pressure);
  EXPECT_EQ(stats.window, 1);
  EXPECT_LE(stats.batches_in_flight, 1u);
  for (int i = 0; i < 5; ++i) {
    ASSERT_EQ(iterator->next(batch, 10s), EpochIterator::Status::kBatch);
    EXPECT_TRUE(batch.warnings.empty());
    EXPECT_LE(loader.stats().batches_in_flight, 1u);
  }
  available = size_t{1} << 40;         // memory came back
  std::this_thread::sleep_for(150ms);  // past the check interval
  for (int i = 0; i < 5; ++i) ASSERT_EQ(iterator->next(batch, 10s), EpochIterator::Status::kBatch);
  stats = loader.stats();
  EXPECT_FALSE(stats.under_pressure);
  EXPECT_EQ(stats.window, 3);
  EXPECT_EQ(stats.pressure_events, 1u);
}

}  // namespace
}  // namespace leanloader

namespace leanloader {
namespace {

// Rows of `row_bytes` bytes; records whether the loader asked for streaming
// stores on each read.
class HintRecordingSource final : public Source {
 public:
  explicit HintRecordingSource(int64_t row_bytes)
      : fields_{{"x", DType::kU8, Shape{row_bytes}}}, row_bytes_(static_cast<size_t>(row_bytes)) {}
  int64_t size() const override { return 64; }
  const std::vector<FieldSpec>& fields() const override { return fields_; }
  void read_sample(int64_t index, SampleWriter& writer) const override {
    std::span<std::byte> row = writer.field_buffer(0, *fields_[0].shape);
    std::fill(row.begin(), row.end(), static_cast<std::byte>(index));
    (writer.prefers_streaming_stores() ? streaming_reads : cached_reads)++;
    const std::lock_guard lock(hints_mutex);
    hinted_before_read += hinted.erase({std::this_thread::get_id(), index});
  }
  void will_read(int64_t index) const noexcept override {
    const std::lock_guard lock(hints_mutex);
    hinted.insert({std::this_thread::get_id(), index});
    ++hints;
  }
  std::string describe() const override { return "HintRecordingSource"; }
  std::string sample_location(int64_t index) const override { return std::to_string(index); }
  size_t estimated_sample_bytes() const override { return row_bytes_; }

  mutable std::atomic<int> streaming_reads{0};
  mutable std::atomic<int> cached_reads{0};
  // will_read(index) calls, and reads of an index this thread was told of.
  mutable std::mutex hints_mutex;
  mutable std::set<std::pair<std::thread::id, int64_t>> hinted;
  mutable int hints = 0;
  mutable int hinted_before_read = 0;

 private:
  std::vector<FieldSpec> fields_;
  size_t row_bytes_;
};

// Batches from streaming_batch_bytes() on are filled with streaming stores
// (they leave the cache before the consumer reads them): several MiB, or an
// eighth of the last-level cache where that is more, since the batches in
// flight then stay in the cache for the consumer. Smaller ones with cached
// stores.
TEST(LoaderTest, SourcesAreAskedForStreamingStoresInBatchesOfSeveralMiBOnly) {
  const size_t threshold = detail::streaming_batch_bytes();
  EXPECT_GE(threshold, detail::kStreamingBatchBytes);
  EXPECT_GE(threshold, detail::last_level_cache_bytes() / 8);
  const auto row_bytes = static_cast<int64_t>(threshold / 8);
  const auto large = std::make_shared<HintRecordingSource>(row_bytes);
  Loader large_batches(large, options(8, false, 2));  // batches of the threshold
  run_epoch(large_batches);
  EXPECT_EQ(large->streaming_reads.load(), 64);
  EXPECT_EQ(large->cached_reads.load(), 0);
  const auto small = std::make_shared<HintRecordingSource>(row_bytes);
  Loader small_batches(small, options(2, false, 2));  // a quarter of it
  run_epoch(small_batches);
  EXPECT_EQ(small->streaming_reads.load(), 0);
  EXPECT_EQ(small->cached_reads.load(), 64);
}

// Within a claimed chunk of rows, the source hears of each row's sample one
// row ahead, on the thread that then reads it (so it can start bringing the
// bytes into the cache): every read but the first of each claim was hinted.
TEST(LoaderTest, SourcesAreToldOfTheNextSampleBeforeReadingIt) {
  const auto source = std::make_shared<HintRecordingSource>(64);
  Loader loader(source, options(16, true, 2));
  run_epoch(loader);
  const auto claims = static_cast<int>(loader.stats().work_claims);
  EXPECT_GT(claims, 0);
  EXPECT_EQ(source->hints, 64 - claims);
  EXPECT_EQ(source->hinted_before_read, 64 - claims);
}

// Every read comes from storage (a cold file); records when the loader
// announces rows (will_need) and the storage around them (will_need_around)
// against how many rows of the first batch (indices below kFirstBatch,
// unshuffled) had been read.
class ColdRecordingSource final : public Source {
 public:
  static constexpr int64_t kFirstBatch = 16;
  int64_t size() const override { return 256; }
  const std::vector<FieldSpec>& fields() const override { return fields_; }
  void read_sample(int64_t index, SampleWriter& writer) const override {
    std::span<std::byte> row = writer.field_buffer(0, *fields_[0].shape);
    std::fill(row.begin(), row.end(), static_cast<std::byte>(index));
    ++reads;
    if (index < kFirstBatch) ++first_batch_rows_read;
  }
  uint64_t storage_reads() const override { return reads.load(); }
  void will_need(int64_t) const noexcept override {
    if (first_batch_rows_read.load() < kFirstBatch) ++rows_announced_during_first_batch;
  }
  void will_need_around(int64_t) const noexcept override {
    ++around_announced;
    if (first_batch_rows_read.load() < kFirstBatch) ++around_announced_during_first_batch;
  }
  std::string describe() const override { return "ColdRecordingSource"; }
  std::string sample_location(int64_t index) const override { return std::to_string(index); }
  size_t estimated_sample_bytes() const override { return 256 << 10; }

  mutable std::atomic<uint64_t> reads{0};
  mutable std::atomic<int64_t> first_batch_rows_read{0};
  mutable std::atomic<int> rows_announced_during_first_batch{0};
  mutable std::atomic<int> around_announced{0};
  mutable std::atomic<int> around_announced_during_first_batch{0};

 private:
  std::vector<FieldSpec> fields_{{"x", DType::kU8, Shape{256 << 10}}};
};

// From a cold file the next rows are announced at once, but the storage
// around them (windows of megabytes that fill the device's queue) only once
// the first batch has been read: its own reads would wait behind them.
TEST(LoaderTest, StorageAroundTheNextRowsIsAnnouncedOnlyAfterTheFirstBatch) {
  const auto source = std::make_shared<ColdRecordingSource>();
  Loader loader(source, options(ColdRecordingSource::kFirstBatch, false, 2));
  run_epoch(loader);
  EXPECT_GT(source->rows_announced_during_first_batch.load(), 0);
  EXPECT_GT(source->around_announced.load(), 0);
  EXPECT_EQ(source->around_announced_during_first_batch.load(), 0);
}

// A source whose rows are not in memory and that counts no storage reads
// (rows copied out of a mapping: their misses show only as page faults):
// records whether each row had been announced when it was read.
class NotInMemorySource final : public Source {
 public:
  int64_t size() const override { return 256; }
  const std::vector<FieldSpec>& fields() const override { return fields_; }
  void read_sample(int64_t index, SampleWriter& writer) const override {
    std::span<std::byte> row = writer.field_buffer(0, *fields_[0].shape);
    std::fill(row.begin(), row.end(), static_cast<std::byte>(index));
    if (!announced_[static_cast<size_t>(index)].load()) ++rows_read_unannounced;
  }
  bool in_memory(int64_t) const noexcept override {
    ++in_memory_asked;
    return false;
  }
  void will_need(int64_t index) const noexcept override {
    announced_[static_cast<size_t>(index)] = true;
  }
  std::string describe() const override { return "NotInMemorySource"; }
  std::string sample_location(int64_t index) const override { return std::to_string(index); }
  size_t estimated_sample_bytes() const override { return 4096; }
  void forget_announcements() {
    for (auto& announced : announced_) announced = false;
  }

  mutable std::atomic<int> in_memory_asked{0};
  mutable std::atomic<int> rows_read_unannounced{0};

 private:
  std::vector<FieldSpec> fields_{{"x", DType::kU8, Shape{4096}}};
  mutable std::array<std::atomic<bool>, 256> announced_{};
};

// A pass asks once whether its first row is in memory; when it is not, its
// rows are announced before any is read (here all 256 fit in the read-ahead:
// one thread, so no other thread reads before the announcement).
TEST(LoaderTest, APassWhoseFirstRowIsNotInMemoryAnnouncesItsRowsBeforeReadingAny) {
  const auto source = std::make_shared<NotInMemorySource>();
  Loader loader(source, options(16, true, 1));
  run_epoch(loader);
  EXPECT_EQ(source->in_memory_asked.load(), 1);
  EXPECT_EQ(source->rows_read_unannounced.load(), 0);
  source->forget_announcements();
  loader.set_epoch(1);
  run_epoch(loader);
  EXPECT_EQ(source->in_memory_asked.load(), 2);
  EXPECT_EQ(source->rows_read_unannounced.load(), 0);
}

// Rows copied out of a mapping of a file that is not in the page cache: the
// source counts no storage reads (storage_reads() stays 0), but its page
// faults wait for storage. Counts the rows the loader announces.
class MappedColdSource final : public Source {
 public:
  explicit MappedColdSource(const std::string& path) : fd_(::open(path.c_str(), O_RDONLY)) {
    bytes_ = static_cast<size_t>(size()) * kRowBytes;
    mapped_ = static_cast<const std::byte*>(::mmap(nullptr, bytes_, PROT_READ, MAP_SHARED, fd_, 0));
    ::madvise(const_cast<std::byte*>(mapped_), bytes_, MADV_RANDOM);  // a fault reads its page
  }
  ~MappedColdSource() override {
    ::munmap(const_cast<std::byte*>(mapped_), bytes_);
    ::close(fd_);
  }
  static constexpr size_t kRowBytes = 4096;
  int64_t size() const override { return 256; }
  const std::vector<FieldSpec>& fields() const override { return fields_; }
  void read_sample(int64_t index, SampleWriter& writer) const override {
    std::span<std::byte> row = writer.field_buffer(0, *fields_[0].shape);
    std::memcpy(row.data(), mapped_ + static_cast<size_t>(index) * kRowBytes, kRowBytes);
  }
  void will_need(int64_t) const noexcept override { ++rows_announced; }
  std::string describe() const override { return "MappedColdSource"; }
  std::string sample_location(int64_t index) const override { return std::to_string(index); }
  size_t estimated_sample_bytes() const override { return kRowBytes; }

  mutable std::atomic<int> rows_announced{0};

 private:
  int fd_;
  size_t bytes_ = 0;
  const std::byte* mapped_ = nullptr;
  std::vector<FieldSpec> fields_{{"x", DType::kU8, Shape{static_cast<int64_t>(kRowBytes)}}};
};

TEST(LoaderTest, RowsCopiedFromAColdMappingAreNoticedAndTheNextOnesAnnounced) {
  TempDir dir;
  const std::string path =
      testing::write_filled_file(dir.file("rows.bin"), 256 * MappedColdSource::kRowBytes);
  {
    const auto cached = std::make_shared<MappedColdSource>(path);
    Loader warm(cached, options(16, true, 2));
    run_epoch(warm);  // no fault waits for storage: nothing is announced
    EXPECT_EQ(cached->rows_announced.load(), 0);
  }
  // Unmapped now, so that its pages can be dropped.
  if (testing::evict_from_page_cache(path) > 4) {
    GTEST_SKIP() << "the file system keeps the file in memory (tmpfs?)";
  }
  const auto cold_source = std::make_shared<MappedColdSource>(path);
  Loader cold(cold_source, options(16, true, 2));
  run_epoch(cold);
  EXPECT_GT(cold_source->rows_announced.load(), 0);
}

}  // namespace
}  // namespace leanloader
