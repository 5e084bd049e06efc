// SlotPool: the batch slots that worker processes write collated batches
// into, carved out of one SharedSegment owned by the main process.
//
// Protocol (ProcessWorkers, python/leanloader/dataloader.py): the main process
// acquires a free slot before it sends a task, names the slot in the task,
// and the worker copies the batch's arrays into that slot of its own mapping
// of the segment and answers with a small header (offsets, dtypes, shapes).
// The main process then wraps the slot's bytes without a copy: hold(slot)
// returns a Storage whose destruction (when the user drops the last tensor of
// the batch) puts the slot back on the free list. A slot that was acquired
// but never handed to the user (an error, a stale epoch) goes back with
// release().
//
// A pool whose memory a device reads asynchronously (slots page-locked in
// place through SlotMemoryHooks, the reads fenced by a SlotReleaseFence)
// prepares the whole segment once at adopt() and undoes it when the pool is
// destroyed, and gives a held slot back only after the fence passes.
//
// The whole segment is reserved at creation (see SharedSegment), so a pool
// that does not fit /dev/shm fails at creation, never with SIGBUS later.
//
// Thread-safety: every method may be called from any thread (slots are
// released from whatever thread drops the last tensor).
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "leanloader/core/storage.h"
#include "leanloader/pipeline/slot_memory_hooks.h"
#include "leanloader/workers/shared_segment.h"
#include "leanloader/workers/slot_release_fence.h"

namespace leanloader {

class SlotPool : public std::enable_shared_from_this<SlotPool> {
 public:
  // slot_bytes is rounded up to a multiple of 4096 so that every slot starts
  // page-aligned. Throws InvalidArgument for zero sizes, IoError from
  // SharedSegment::create.
  static std::shared_ptr<SlotPool> create(size_t slot_bytes, size_t num_slots,
                                          const std::string& dir = "");
  // A pool over an existing segment (one a worker process created for a
  // batch and the main process attached): num_slots slots of slot_bytes from
  // offset 0. slot_bytes is not rounded here; it must be above 0 and
  // num_slots x slot_bytes must fit the segment, else InvalidArgument.
  // With `hooks`, on_create(segment) runs here (its error propagates: no pool
  // is made) and on_destroy(segment) when the pool is destroyed, before the
  // segment is unmapped.
  static std::shared_ptr<SlotPool> adopt(std::shared_ptr<SharedSegment> segment, size_t slot_bytes,
                                         size_t num_slots,
                                         std::shared_ptr<SlotMemoryHooks> hooks = nullptr);
  ~SlotPool();
  SlotPool(const SlotPool&) = delete;
  SlotPool& operator=(const SlotPool&) = delete;

  // A free slot id, or nullopt when every slot is acquired or held. Never
  // blocks: the caller decides what to do when the pool is exhausted.
  std::optional<size_t> acquire();
  // Returns an acquired slot that was never wrapped by hold().
  void release(size_t slot);
  // Wraps an acquired slot as a Storage; the slot becomes free again when
  // the returned Storage (and every Tensor viewing it) is gone, or with
  // `fence`, once the fence says the reads queued before then are over (the
  // pool lives at least until then).
  std::shared_ptr<Storage> hold(size_t slot, std::shared_ptr<SlotReleaseFence> fence = nullptr);

  size_t slot_bytes() const noexcept { return slot_bytes_; }
  size_t num_slots() const noexcept { return num_slots_; }
  // Byte offset of `slot` in the segment.
  size_t slot_offset(size_t slot) const noexcept { return slot * slot_bytes_; }
  size_t slots_in_use() const;
  const std::shared_ptr<SharedSegment>& segment() const noexcept { return segment_; }

 private:
  friend class SlotStorage;
  SlotPool(std::shared_ptr<SharedSegment> segment, size_t slot_bytes, size_t num_slots);
  void check_slot(size_t slot, const char* what) const;
  void give_back(size_t slot) noexcept;

  std::shared_ptr<SharedSegment> segment_;
  std::shared_ptr<SlotMemoryHooks> hooks_;  // prepared the whole segment when set
  const size_t slot_bytes_;
  const size_t num_slots_;
  mutable std::mutex mutex_;
  std::vector<size_t> free_;  // LIFO: the most recently used slot is warm
  std::vector<bool> acquired_;
};

}  // namespace leanloader
