// DeviceReadFence with SlotPool: batch segments page-locked in place and
// reused only after the device copies queued before their release have run.
// The device is the CPU stand-in runtime (CUDA's stream and event semantics).
#include "leanloader/device/device_read_fence.h"

#include <gtest/gtest.h>
#include <poll.h>

#include <chrono>
#include <cstring>
#include <optional>
#include <thread>
#include <vector>

#include "leanloader/device/host_pinning.h"
#include "leanloader/device/host_stand_in_runtime.h"
#include "leanloader/workers/slot_pool.h"

namespace leanloader {
namespace {

using namespace std::chrono_literals;

// A one-slot pool over a segment a worker would have made, page-locked through
// `pinning`, with the slot acquired and filled with `fill`.
struct PinnedBatch {
  std::shared_ptr<SlotPool> pool;
  size_t slot = 0;

  PinnedBatch(const std::shared_ptr<HostPinning>& pinning, size_t bytes, unsigned char fill) {
    pool = SlotPool::adopt(SharedSegment::create(bytes), bytes, 1, pinning);
    slot = *pool->acquire();
    std::memset(pool->segment()->data(), fill, bytes);
  }
};

bool wait_until(const std::function<bool()>& condition) {
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!condition()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

// The stand-in device, its pinning and a consumer stream (destroyed after
// the test's batches and fences, which may record on it).
class DeviceReadFenceTest : public ::testing::Test {
 protected:
  void TearDown() override { runtime->destroy_stream(consumer); }

  std::shared_ptr<HostStandInRuntime> runtime = std::make_shared<HostStandInRuntime>();
  std::shared_ptr<HostPinning> pinning = std::make_shared<HostPinning>(runtime);
  DeviceRuntime::Stream consumer = runtime->create_stream();

  // A fence that knows the consumer stream.
  std::shared_ptr<DeviceReadFence> consumer_fence() {
    auto fence = std::make_shared<DeviceReadFence>(runtime);
    fence->note_consumer_stream(consumer);
    return fence;
  }
};

TEST_F(DeviceReadFenceTest, AnAdoptedSegmentIsPageLockedWhileItsPoolLives) {
  {
    PinnedBatch batch(pinning, 3 * 4096, 1);
    EXPECT_EQ(runtime->registered_bytes(), 3u * 4096u);
    EXPECT_EQ(pinning->pinned_bytes(), 3u * 4096u);
  }
  EXPECT_EQ(runtime->registered_bytes(), 0u);
  EXPECT_EQ(pinning->pinned_bytes(), 0u);
  EXPECT_EQ(pinning->peak_pinned_bytes(), 3u * 4096u);
}

TEST_F(DeviceReadFenceTest, AReleasedSlotWaitsForTheCopyQueuedOnTheConsumersStream) {
  auto fence = consumer_fence();
  const size_t bytes = 4096;
  PinnedBatch batch(pinning, bytes, 7);
  std::byte* device = runtime->allocate(bytes);
  {
    auto held = batch.pool->hold(batch.slot, fence);
    // The user's .to(device, non_blocking=True): queued behind slow work.
    runtime->delay(consumer, 150ms);
    runtime->copy_to_device(device, held->data(), bytes, consumer);
  }                                           // the batch is dropped at once
  EXPECT_EQ(batch.pool->slots_in_use(), 1u);  // not yet reusable
  EXPECT_EQ(fence->pending(), 1u);
  ASSERT_TRUE(wait_until([&] { return fence->collect() == 1; }));
  EXPECT_EQ(batch.pool->slots_in_use(), 0u);
  // The next batch written into the slot cannot reach the copy any more.
  std::memset(batch.pool->segment()->data(), 9, bytes);
  runtime->drain(consumer);
  std::vector<std::byte> copied(bytes);
  std::memcpy(copied.data(), device, bytes);
  EXPECT_EQ(copied, std::vector<std::byte>(bytes, std::byte{7}));
  EXPECT_EQ(fence->fenced_total(), 1u);
  EXPECT_EQ(fence->pending(), 0u);
  runtime->free(device);
}

TEST_F(DeviceReadFenceTest, TheStreamCurrentWhereTheBatchIsDroppedIsFencedToo) {
  const auto side = runtime->create_stream();
  // A prefetcher's pattern: next() on one stream, the copy and the drop
  // under `with torch.cuda.stream(side)`.
  std::optional<DeviceRuntime::Stream> current = side;
  auto fence = std::make_shared<DeviceReadFence>(runtime, [&current] { return current; });
  fence->note_consumer_stream(0);
  PinnedBatch batch(pinning, 4096, 1);
  {
    auto held = batch.pool->hold(batch.slot, fence);
    runtime->delay(side, 150ms);
  }
  EXPECT_EQ(batch.pool->slots_in_use(), 1u);
  runtime->drain(side);
  ASSERT_TRUE(wait_until([&] { return fence->collect() == 1; }));
  EXPECT_EQ(batch.pool->slots_in_use(), 0u);
  runtime->destroy_stream(side);
}

TEST_F(DeviceReadFenceTest, AStreamSeenAtOneReleaseIsFencedAtLaterReleasesToo) {
  const auto side = runtime->create_stream();
  const auto other = runtime->create_stream();
  std::optional<DeviceRuntime::Stream> current = side;
  auto fence = std::make_shared<DeviceReadFence>(runtime, [&current] { return current; });
  PinnedBatch first(pinning, 4096, 1);
  first.pool->hold(first.slot, fence).reset();  // dropped under `side`: remembered
  ASSERT_TRUE(wait_until([&] { return fence->collect() == 1; }));
  // The next batch is copied on `side` but dropped where `other` is current.
  current = other;
  PinnedBatch second(pinning, 4096, 2);
  runtime->delay(side, 150ms);
  second.pool->hold(second.slot, fence).reset();
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(second.pool->slots_in_use(), 1u);
  runtime->drain(side);
  ASSERT_TRUE(wait_until([&] { return fence->collect() == 1; }));
  EXPECT_EQ(second.pool->slots_in_use(), 0u);
  runtime->destroy_stream(side);
  runtime->destroy_stream(other);
}

TEST_F(DeviceReadFenceTest, ASegmentIsUnlockedAndUnmappedOnlyAfterItsPendingReads) {
  auto fence = consumer_fence();
  const size_t bytes = 64 * 4096;
  std::byte* device = runtime->allocate(bytes);
  {
    // A large batch segment: not kept for reuse, freed with its batch.
    PinnedBatch batch(pinning, bytes, 3);
    auto held = batch.pool->hold(batch.slot, fence);
    runtime->delay(consumer, 150ms);
    runtime->copy_to_device(device, held->data(), bytes, consumer);
  }
  // Pool and batch are gone for the host; the copy has not run yet.
  EXPECT_EQ(runtime->registered_bytes(), bytes);
  runtime->drain(consumer);
  ASSERT_TRUE(wait_until([&] { return fence->completed() == 1; }));
  // The pool goes (unlocked, unmapped) when its release is collected.
  EXPECT_EQ(runtime->registered_bytes(), bytes);
  EXPECT_EQ(fence->collect(), 1u);
  EXPECT_EQ(runtime->registered_bytes(), 0u);
  EXPECT_EQ(std::memcmp(device, std::vector<std::byte>(bytes, std::byte{3}).data(), bytes), 0);
  runtime->free(device);
}

TEST_F(DeviceReadFenceTest, DestroyingTheFenceWaitsForItsPendingReleases) {
  std::shared_ptr<SlotPool> pool;
  const auto start = std::chrono::steady_clock::now();
  {
    auto fence = consumer_fence();
    PinnedBatch batch(pinning, 4096, 1);
    pool = batch.pool;
    runtime->delay(consumer, 100ms);
    batch.pool->hold(batch.slot, fence).reset();
    EXPECT_EQ(pool->slots_in_use(), 1u);
  }
  // The fence is gone, and its pending release completed first.
  EXPECT_GE(std::chrono::steady_clock::now() - start, 100ms);
  EXPECT_EQ(pool->slots_in_use(), 0u);
}

TEST_F(DeviceReadFenceTest, ItsDescriptorIsReadableWhileCompletedReleasesWaitForCollection) {
  auto fence = consumer_fence();
  PinnedBatch batch(pinning, 4096, 1);
  const auto readable = [&](int timeout_ms) {
    pollfd watched{fence->ready_fd(), POLLIN, 0};
    return ::poll(&watched, 1, timeout_ms) == 1;
  };
  EXPECT_FALSE(readable(0));
  runtime->delay(consumer, 100ms);
  batch.pool->hold(batch.slot, fence).reset();
  EXPECT_FALSE(readable(20));  // the copy stream is still busy
  EXPECT_TRUE(readable(10000));
  EXPECT_EQ(batch.pool->slots_in_use(), 1u);  // nothing runs until collected
  EXPECT_EQ(fence->collect(), 1u);
  EXPECT_EQ(batch.pool->slots_in_use(), 0u);
  EXPECT_FALSE(readable(0));
}

TEST_F(DeviceReadFenceTest, WithoutAFenceASlotComesBackWithItsLastView) {
  PinnedBatch batch(pinning, 4096, 1);
  batch.pool->hold(batch.slot).reset();
  EXPECT_EQ(batch.pool->slots_in_use(), 0u);
}

}  // namespace
}  // namespace leanloader
