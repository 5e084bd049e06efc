#include "leanloader/device/device_feed.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "leanloader/core/error.h"
#include "leanloader/device/cuda_runtime.h"
#include "leanloader/device/host_pinning.h"
#include "leanloader/device/host_stand_in_runtime.h"
#include "leanloader/pipeline/loader.h"
#include "leanloader/sources/array_source.h"
#include "test_util.h"

namespace leanloader {
namespace {

using namespace std::chrono_literals;
using testing::id_source;

// A loader whose slots are page-locked through `runtime`.
struct PinnedLoader {
  std::shared_ptr<HostPinning> pinning;
  std::unique_ptr<Loader> loader;

  PinnedLoader(const std::shared_ptr<DeviceRuntime>& runtime, int64_t size, int64_t batch_size,
               bool shuffle = true) {
    pinning = std::make_shared<HostPinning>(runtime);
    LoaderOptions options;
    options.batch_size = batch_size;
    options.shuffle = shuffle;
    options.num_threads = 2;
    options.slot_hooks = pinning;
    loader = std::make_unique<Loader>(id_source(size), options);
  }
};

std::vector<int64_t> ids_of(const Batch& batch) {
  const Tensor& id = batch.stacked[0];
  const auto* values = reinterpret_cast<const int64_t*>(id.data());
  return {values, values + id.shape()[0]};
}

// A stream of the stand-in, destroyed at the end of the scope (declare it
// before the batches used on it: they record on it when they die).
class ScopedStream {
 public:
  explicit ScopedStream(std::shared_ptr<HostStandInRuntime> runtime)
      : runtime_(std::move(runtime)), stream_(runtime_->create_stream()) {}
  ~ScopedStream() { runtime_->destroy_stream(stream_); }
  operator DeviceRuntime::Stream() const { return stream_; }

 private:
  std::shared_ptr<HostStandInRuntime> runtime_;
  DeviceRuntime::Stream stream_;
};

EpochIterator::Status next(DeviceFeed& feed, EpochIterator& host, Batch& out,
                           DeviceRuntime::Stream consumer) {
  return feed.next(host, out, consumer, 10s);
}

TEST(HostStandInRuntimeTest, AStreamWaitsForAnEventOfAnotherStream) {
  HostStandInRuntime runtime;
  const auto slow = runtime.create_stream();
  const auto fast = runtime.create_stream();
  const auto event = runtime.create_event();
  std::vector<int> order;
  std::mutex mutex;
  runtime.delay(slow, 50ms);
  runtime.enqueue(slow, [&] {
    std::lock_guard lock(mutex);
    order.push_back(1);
  });
  runtime.record(event, slow);
  EXPECT_FALSE(runtime.done(event));
  runtime.wait(fast, event);
  runtime.enqueue(fast, [&] {
    std::lock_guard lock(mutex);
    order.push_back(2);
  });
  runtime.drain(fast);
  EXPECT_TRUE(runtime.done(event));
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
  runtime.destroy_event(event);
  runtime.destroy_stream(slow);
  runtime.destroy_stream(fast);
}

TEST(DeviceFeedTest, DeviceBatchesEqualHostBatchesOverEpochs) {
  auto runtime = std::make_shared<HostStandInRuntime>();
  PinnedLoader host(runtime, 100, 16);
  // The same order without a device, for comparison.
  LoaderOptions plain;
  plain.batch_size = 16;
  plain.shuffle = true;
  Loader reference(id_source(100), plain);
  DeviceFeed feed(runtime, host.loader->slot_bytes(), 1);
  const ScopedStream consumer(runtime);
  for (int epoch = 0; epoch < 3; ++epoch) {
    auto device_pass = host.loader->iterate();
    auto host_pass = reference.iterate();
    feed.reset();
    Batch device_batch, host_batch;
    int batches = 0;
    while (next(feed, *device_pass, device_batch, consumer) == EpochIterator::Status::kBatch) {
      ASSERT_EQ(host_pass->next(host_batch, 10s), EpochIterator::Status::kBatch);
      runtime->drain(consumer);  // the consumer's stream has passed the copy
      EXPECT_EQ(ids_of(device_batch), ids_of(host_batch));
      EXPECT_EQ(device_batch.indices, host_batch.indices);
      ASSERT_EQ(device_batch.stacked.size(), 2u);
      EXPECT_EQ(device_batch.stacked[1].shape(), host_batch.stacked[1].shape());
      EXPECT_EQ(std::memcmp(device_batch.stacked[1].data(), host_batch.stacked[1].data(),
                            host_batch.stacked[1].nbytes()),
                0);
      EXPECT_EQ(device_batch.stacked[0].storage()->kind(), StorageKind::kDevice);
      ++batches;
    }
    EXPECT_EQ(batches, 7);
    EXPECT_EQ(host_pass->next(host_batch, 10s), EpochIterator::Status::kEnd);
  }
  EXPECT_EQ(feed.device_bill(), 3 * host.loader->slot_bytes());
  EXPECT_LE(feed.device_resident_bytes(), feed.device_bill());
  EXPECT_EQ(feed.overflow_total(), 0u);
}

TEST(DeviceFeedTest, TheConsumersStreamRunsAfterTheCopy) {
  auto runtime = std::make_shared<HostStandInRuntime>();
  PinnedLoader host(runtime, 64, 16, /*shuffle=*/false);
  DeviceFeed feed(runtime, host.loader->slot_bytes(), 0);
  runtime->delay_copies(100ms);
  const ScopedStream consumer(runtime);
  auto pass = host.loader->iterate();
  Batch batch;
  const auto start = std::chrono::steady_clock::now();
  ASSERT_EQ(next(feed, *pass, batch, consumer), EpochIterator::Status::kBatch);
  // The host did not wait for the copy...
  EXPECT_LT(std::chrono::steady_clock::now() - start, 90ms);
  // ...but the consumer's stream did: a kernel enqueued now reads copied bytes.
  std::vector<int64_t> seen(16, -1);
  runtime->enqueue(consumer, [&] {
    std::memcpy(seen.data(), batch.stacked[0].data(), seen.size() * sizeof(int64_t));
  });
  runtime->drain(consumer);
  for (int64_t i = 0; i < 16; ++i) EXPECT_EQ(seen[static_cast<size_t>(i)], i);
}

TEST(DeviceFeedTest, AHostSlotReturnsWhenItsCopyIsDoneNotWhenTheDeviceBatchIsDropped) {
  auto runtime = std::make_shared<HostStandInRuntime>();
  PinnedLoader host(runtime, 64, 16, /*shuffle=*/false);
  DeviceFeed feed(runtime, host.loader->slot_bytes(), 0);
  runtime->delay_copies(150ms);
  const ScopedStream consumer(runtime);
  auto pass = host.loader->iterate();
  Batch batch;
  ASSERT_EQ(next(feed, *pass, batch, consumer), EpochIterator::Status::kBatch);
  EXPECT_EQ(feed.copies_completed(), 0u);  // still copying: the slot is held
  runtime->drain(consumer);
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (feed.copies_completed() == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_GE(feed.copies_completed(), 1u);
  // The device batch is still held, its host slot is not.
  EXPECT_EQ(ids_of(batch)[3], 3);
  EXPECT_LE(host.loader->stats().slots_in_use, 2u);  // batches copied ahead, not this one
}

TEST(DeviceFeedTest, ABlockIsNotOverwrittenWhileTheConsumersStreamStillReadsIt) {
  auto runtime = std::make_shared<HostStandInRuntime>();
  PinnedLoader host(runtime, 160, 16, /*shuffle=*/false);
  DeviceFeed feed(runtime, host.loader->slot_bytes(), 0);  // two blocks
  const ScopedStream consumer(runtime);
  auto pass = host.loader->iterate();
  std::vector<int64_t> seen(16, -1);
  {
    Batch first;
    ASSERT_EQ(next(feed, *pass, first, consumer), EpochIterator::Status::kBatch);
    // A long kernel on the consumer's stream, then one that reads batch 0.
    runtime->delay(consumer, 150ms);
    const std::byte* data = first.stacked[0].data();
    runtime->enqueue(
        consumer, [&seen, data] { std::memcpy(seen.data(), data, seen.size() * sizeof(int64_t)); });
  }  // batch 0 dropped on the host while its stream still has to read it
  Batch later;
  for (int b = 1; b <= 4; ++b) {  // reuses batch 0's block
    ASSERT_EQ(next(feed, *pass, later, consumer), EpochIterator::Status::kBatch);
  }
  runtime->drain(consumer);
  for (int64_t i = 0; i < 16; ++i) EXPECT_EQ(seen[static_cast<size_t>(i)], i) << i;
  EXPECT_EQ(ids_of(later)[0], 64);
  EXPECT_EQ(feed.overflow_total(), 0u);
}

TEST(DeviceFeedTest, PinnedBytesAreTheSlotsAndNoneLeakOverThirtyEpochs) {
  auto runtime = std::make_shared<HostStandInRuntime>();
  size_t slot_bytes = 0, num_slots = 0;
  {
    PinnedLoader host(runtime, 200, 32);
    slot_bytes = host.loader->slot_bytes();
    num_slots = host.loader->num_slots();
    DeviceFeed feed(runtime, slot_bytes, 2);
    const ScopedStream consumer(runtime);
    for (int epoch = 0; epoch < 30; ++epoch) {
      auto pass = host.loader->iterate();
      feed.reset();
      Batch batch;
      while (next(feed, *pass, batch, consumer) == EpochIterator::Status::kBatch) {
      }
      EXPECT_EQ(runtime->registered_bytes(), host.pinning->pinned_bytes());
      EXPECT_LE(host.pinning->peak_pinned_bytes(), num_slots * slot_bytes);
    }
    // Each slot was page-locked once, when its pool made it.
    EXPECT_LE(runtime->registrations(), num_slots);
    EXPECT_EQ(host.pinning->pinned_bytes() % slot_bytes, 0u);
    runtime->drain(consumer);
  }
  EXPECT_EQ(runtime->registered_bytes(), 0u);
  EXPECT_EQ(runtime->allocated_bytes(), 0u);
}

TEST(DeviceFeedTest, ListCollatedBatchesAreRefusedClearly) {
  auto runtime = std::make_shared<HostStandInRuntime>();
  auto pinning = std::make_shared<HostPinning>(runtime);
  LoaderOptions options;
  options.batch_size = 16;
  options.slot_hooks = pinning;
  options.collate = Collate::kList;
  Loader loader(id_source(64), options);
  DeviceFeed feed(runtime, loader.slot_bytes(), 1);
  auto pass = loader.iterate();
  Batch batch;
  EXPECT_THROW(next(feed, *pass, batch, 0), InvalidArgument);  // collate=list
}

TEST(CudaRuntimeTest, WithoutCudaLoadingSaysWhy) {
  if (CudaRuntime::device_count() > 0) GTEST_SKIP() << "CUDA is present";
  try {
    CudaRuntime::load(0);
    FAIL() << "expected an error";
  } catch (const Error& error) {
    const std::string message = error.what();
    // Either libcudart is missing, or it is here without a working driver.
    EXPECT_NE(message.find("device='cuda' needs the CUDA runtime"), std::string::npos) << message;
    EXPECT_TRUE(message.find("libcudart could not be loaded") != std::string::npos ||
                message.find("cudaGetDeviceCount failed") != std::string::npos)
        << message;
  }
}

}  // namespace
}  // namespace leanloader
