// DeviceFeed: moves the Loader's batches to a device, overlapped with the
// consumer's work, without a host sync and without a staging copy.
//
// Per batch: a device block is taken from a small pool (prefetch_to_device
// blocks in flight + 1 the consumer holds, made on first use); the copy
// stream first waits for the event recorded when that block's previous batch
// was released (so a block is never overwritten while the consumer's stream
// may still read it), then copies each field from its page-locked host slot
// (device/host_pinning.h), then records a copy-done event. On delivery the
// consumer's stream waits on that event: the host returns at once and the
// consumer's kernels run after the copy. The host slot goes back to its
// BatchPool when the copy is done (a completion thread waits on copy-done
// events in order), not when the user drops the device tensors. When the
// last device tensor of a batch dies, an event is recorded on the stream the
// batch was delivered on, and the block returns to the pool fenced by it.
//
// Up to prefetch_to_device batches are copied ahead of the one delivered,
// from host batches that are already ready (next() never waits for more).
//
// Thread-safety: next()/reset() are called by the consumer thread; device
// tensors may be dropped on any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>

#include "leanloader/device/device_runtime.h"
#include "leanloader/pipeline/batch.h"
#include "leanloader/pipeline/epoch_iterator.h"

namespace leanloader {

namespace detail {
struct DeviceFeedState;
}  // namespace detail

class DeviceFeed {
 public:
  // `block_bytes`: the host slot size (every batch's fields lie in one slot).
  // Throws InvalidArgument for prefetch_to_device < 0 or a size that
  // overflows.
  DeviceFeed(std::shared_ptr<DeviceRuntime> runtime, size_t block_bytes, int prefetch_to_device);
  // Waits for the copies in flight, then frees every idle block (blocks still
  // viewed by device tensors are freed when those die).
  ~DeviceFeed();
  DeviceFeed(const DeviceFeed&) = delete;
  DeviceFeed& operator=(const DeviceFeed&) = delete;

  // The next batch of `host`, on the device, ordered before later work on
  // `consumer`. kTimeout when no host batch came within `timeout`; kEnd after
  // the last one. A host error is rethrown after the batches copied ahead of
  // it were delivered. Throws InvalidArgument for collate=list batches.
  EpochIterator::Status next(EpochIterator& host, Batch& out, DeviceRuntime::Stream consumer,
                             std::chrono::milliseconds timeout);
  // Drops batches copied ahead (a pass ended early); their host slots return
  // once their copies are done.
  void reset();

  const DeviceRuntime& runtime() const noexcept;
  size_t block_bytes() const noexcept;
  int prefetch_to_device() const noexcept;
  // Planned device bytes: (prefetch_to_device + 1) blocks, known up front.
  size_t device_bill() const noexcept;
  // Device bytes alive now (pooled blocks made + overflow blocks alive).
  size_t device_resident_bytes() const;
  // Blocks allocated beyond the plan because the consumer held more device
  // batches than prefetch_to_device + 1 (freed when released).
  uint64_t overflow_total() const;
  // Host batches whose copy finished and whose slots were handed back.
  uint64_t copies_completed() const;

 private:
  std::shared_ptr<detail::DeviceFeedState> state_;
};

}  // namespace leanloader
