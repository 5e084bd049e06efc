// Nothing reachable from a worker job may throw past it (a throw through the
// job's noexcept boundary terminates the training process): failures outside
// a sample's read become errors at the consumer, and the loader stays usable.
// Also: the executor and the batch pool under concurrent cancel and finalize.
#include <errno.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "allocation_hooks.h"
#include "leanloader/core/error.h"
#include "leanloader/pipeline/batch_pool.h"
#include "leanloader/pipeline/executor.h"
#include "leanloader/pipeline/loader.h"
#include "leanloader/sources/array_source.h"

namespace leanloader {
namespace {

using namespace std::chrono_literals;

// `size` samples of one uint8 field "v" (= index % 256).
std::shared_ptr<ArraySource> byte_source(int64_t size) {
  auto bytes = HeapStorage::allocate(static_cast<size_t>(size));
  for (int64_t i = 0; i < size; ++i) bytes->data()[i] = static_cast<std::byte>(i % 256);
  return std::make_shared<ArraySource>(
      std::vector<ArraySource::Field>{{"v", Tensor(bytes, 0, DType::kU8, {size})}});
}

// Runs a pass to its end; returns the number of samples delivered.
int64_t drain(Loader& loader) {
  auto iterator = loader.iterate();
  Batch batch;
  int64_t samples = 0;
  while (iterator->next(batch, 10s) == EpochIterator::Status::kBatch) {
    samples += batch.stacked[0].shape()[0];
  }
  return samples;
}

TEST(JobFailureTest, AFailedReadOfAvailableMemoryIsAnErrorAtTheConsumer) {
  std::atomic<bool> failing{true};
  LoaderOptions options;
  options.batch_size = 8;
  options.num_threads = 2;
  options.pressure_threshold = size_t{1} << 20;
  options.available_memory = [&]() -> size_t {
    if (failing) throw IoError("cannot read", "/proc/meminfo", EMFILE);
    return size_t{1} << 40;
  };
  Loader loader(byte_source(100), options);
  {
    auto iterator = loader.iterate();
    Batch batch;
    try {
      iterator->next(batch, 10s);
      FAIL() << "expected the failed read of /proc/meminfo at the consumer";
    } catch (const SampleError& error) {
      EXPECT_EQ(error.stage(), "check memory pressure");
      EXPECT_EQ(error.kind(), ErrorKind::kIo);
      EXPECT_NE(std::string(error.what()).find("/proc/meminfo"), std::string::npos) << error.what();
    }
    // The pass ended with its error.
    EXPECT_EQ(iterator->next(batch, 1s), EpochIterator::Status::kEnd);
  }
  failing = false;
  std::this_thread::sleep_for(150ms);  // past the policy's check interval
  EXPECT_EQ(drain(loader), 100);       // the loader lives on
}

TEST(JobFailureTest, AllocationFailureInsideAJobIsAnErrorAtTheConsumer) {
  // A batch's bookkeeping holds one int64 sample index per row: with 77,777
  // rows that is one allocation of exactly 622,216 bytes (a size no other
  // code asks for), inside the worker that opens the batch.
  constexpr int64_t kRows = 77'777;
  LoaderOptions options;
  options.batch_size = kRows;
  options.num_threads = 2;
  options.prefetch = 1;
  Loader loader(byte_source(kRows * 2), options);
  testing::failed_allocations = 0;
  testing::failing_allocation_bytes = static_cast<size_t>(kRows) * sizeof(int64_t);
  {
    auto iterator = loader.iterate();
    Batch batch;
    try {
      iterator->next(batch, 10s);
      testing::failing_allocation_bytes = 0;
      FAIL() << "expected the allocation failure at the consumer";
    } catch (const SampleError& error) {
      testing::failing_allocation_bytes = 0;
      EXPECT_EQ(error.stage(), "open batch");
      EXPECT_EQ(error.kind(), ErrorKind::kOutOfMemory) << error.what();
    }
  }
  EXPECT_GE(testing::failed_allocations.load(), 1);
  EXPECT_EQ(drain(loader), kRows * 2);
}

// A job whose threads finalize shared state while run() cancels it.
class CountingJob final : public Job {
 public:
  explicit CountingJob(std::shared_ptr<BatchPool> pool) : pool_(std::move(pool)) {}
  void work(int /*worker*/) noexcept override {
    while (!cancelled_.load()) {
      try {
        std::shared_ptr<Storage> slot = pool_->acquire(1ms);
        slot->data()[0] = std::byte{1};
        ++finished_;
      } catch (...) {
        ++failed_;
      }
    }
  }
  void cancel() noexcept override { cancelled_ = true; }
  int finished() const { return finished_.load(); }
  int failed() const { return failed_.load(); }

 private:
  std::shared_ptr<BatchPool> pool_;
  std::atomic<bool> cancelled_{false};
  std::atomic<int> finished_{0};
  std::atomic<int> failed_{0};
};

TEST(JobFailureTest, ExecutorAndBatchPoolUnderConcurrentCancelAndFinalize) {
  auto pool = BatchPool::create(4096, 3);
  Executor executor(4);
  std::atomic<bool> stop{false};
  // Another thread trims the pool while slots are taken and returned.
  std::thread trimmer([&] {
    while (!stop) {
      pool->trim();
      std::this_thread::yield();
    }
  });
  for (int round = 0; round < 200; ++round) {
    auto job = std::make_shared<CountingJob>(pool);
    executor.run(job, 2s);  // cancels and quiesces the previous job
    if (round % 7 == 0) std::this_thread::sleep_for(1ms);
  }
  stop = true;
  trimmer.join();
  EXPECT_TRUE(executor.shutdown(2s));
  EXPECT_EQ(pool->slots_in_use(), 0u);
  EXPECT_EQ(pool->overflow_in_use(), 0u);
}

TEST(JobFailureTest, PassesCancelledAtEveryPointLeaveNoSlotBehind) {
  LoaderOptions options;
  options.batch_size = 4;
  options.num_threads = 2;
  options.prefetch = 3;
  Loader loader(byte_source(64), options);
  for (int taken = 0; taken < 17; ++taken) {
    auto iterator = loader.iterate();
    Batch batch;
    for (int i = 0; i < taken; ++i) {
      if (iterator->next(batch, 10s) != EpochIterator::Status::kBatch) break;
    }
    batch = Batch{};
    // Dropping the iterator cancels the pass while workers finalise batches.
  }
  EXPECT_EQ(drain(loader), 64);
  // A worker may still be returning from the last sample it wrote (its own
  // reference to the slot dies as it leaves): wait for the pool to settle.
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  LoaderStats stats = loader.stats();
  while ((stats.slots_in_use != 0 || stats.overflow_slots_in_use != 0) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(1ms);
    stats = loader.stats();
  }
  EXPECT_EQ(stats.slots_in_use, 0u);
  EXPECT_EQ(stats.overflow_slots_in_use, 0u);
}

}  // namespace
}  // namespace leanloader
