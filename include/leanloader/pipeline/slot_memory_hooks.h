// SlotMemoryHooks: what a BatchPool tells an observer of its blocks' memory,
// so that slot memory can be prepared in place once (page-locked for
// transfers to a device: device/host_pinning.h) instead of per batch.
#pragma once

#include <cstddef>

namespace leanloader {

class SlotMemoryHooks {
 public:
  virtual ~SlotMemoryHooks() = default;
  // A block was created (before any batch is written into it). May throw: the
  // block is then freed and acquire() fails with that error.
  virtual void on_create(std::byte* data, size_t bytes) = 0;
  // A block is about to be freed (after its last view is gone). Must not throw.
  virtual void on_destroy(std::byte* data, size_t bytes) noexcept = 0;
};

}  // namespace leanloader
