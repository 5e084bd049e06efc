// SlotReleaseFence: what a SlotPool asks before a released slot can be written
// again, when readers the pool cannot see may still be reading it after its
// last host view is gone: copies a device runs asynchronously from a slot
// that was page-locked in place (ll.DataLoader(pin_memory=True), where the
// user's `.to(device, non_blocking=True)` reads the batch's shared segment).
// device/device_read_fence.h is the implementation for device runtimes.
#pragma once

#include <functional>

namespace leanloader {

class SlotReleaseFence {
 public:
  virtual ~SlotReleaseFence() = default;
  // The last view of a slot is gone: runs `then` once every read of it that
  // was queued before this call has finished, at once or later, on any
  // thread. Must not throw; `then` must not throw either.
  virtual void after_pending_reads(std::function<void()> then) noexcept = 0;
};

}  // namespace leanloader
