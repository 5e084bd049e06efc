// HostPinning: page-locks every batch slot in place when its BatchPool creates
// it (and unlocks it before it is freed), so that a batch copies to the device
// by DMA straight from its slot: no pinned staging copy per batch, as torch's
// pin_memory makes. Pinned memory is unreclaimable; its bytes are the slots'
// bytes, already in Loader::memory_bill().
//
// Thread-safety: the hooks may run on any thread; the counters are atomic.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "leanloader/device/device_runtime.h"
#include "leanloader/pipeline/slot_memory_hooks.h"

namespace leanloader {

class HostPinning final : public SlotMemoryHooks {
 public:
  explicit HostPinning(std::shared_ptr<DeviceRuntime> runtime) : runtime_(std::move(runtime)) {}

  void on_create(std::byte* data, size_t bytes) override;
  void on_destroy(std::byte* data, size_t bytes) noexcept override;

  // Bytes page-locked now, and the most ever locked at once.
  size_t pinned_bytes() const noexcept { return pinned_.load(); }
  size_t peak_pinned_bytes() const noexcept { return peak_.load(); }

 private:
  std::shared_ptr<DeviceRuntime> runtime_;
  std::atomic<size_t> pinned_{0};
  std::atomic<size_t> peak_{0};
};

}  // namespace leanloader
