// BatchPool: a fixed set of equally sized batch slots, planned in advance.
//
// Workers write samples straight into a slot's rows; tensors of the delivered
// batch view the slot; the slot returns to the pool when the last view is
// released (the Storage handed out by acquire() is a shared_ptr whose
// destruction returns the block). Steady state allocates nothing: blocks are
// created on first use, up to num_slots (the planned bill; fewer while the
// loader needs fewer), and reused after that.
//
// acquire() never blocks. When every slot is held (the consumer keeps more
// batches alive than the pool has slots) it allocates a block beyond the
// pool, which is freed, not pooled, on release; the first such event is
// reported once through take_overflow_warning().
//
// Thread-safety: all methods may be called from any thread.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <vector>

#include "leanloader/core/storage.h"
#include "leanloader/pipeline/slot_memory_hooks.h"

namespace leanloader {

class BatchPool : public std::enable_shared_from_this<BatchPool> {
 public:
  // `hooks` (optional) sees every block, pooled or overflow, created and freed.
  static std::shared_ptr<BatchPool> create(size_t slot_bytes, size_t num_slots,
                                           std::shared_ptr<SlotMemoryHooks> hooks = nullptr);

  // A slot: a free pooled block, else a new one while fewer than
  // min(`wanted`, num_slots) exist (`wanted`: the slots the loader's current
  // prefetch depth needs). Beyond that it waits up to `patience` for a block
  // to come back (in a `for` loop the consumer drops its previous batch right
  // after taking the next), then creates one while fewer than num_slots
  // exist, else allocates an overflow block. After a wait that saw no block
  // come back, it does not wait again until one does. Throws OutOfMemory when
  // the memory cannot be obtained.
  std::shared_ptr<Storage> acquire(
      std::chrono::milliseconds patience = std::chrono::milliseconds(0),
      size_t wanted = std::numeric_limits<size_t>::max());

  size_t slot_bytes() const noexcept { return slot_bytes_; }
  size_t num_slots() const noexcept { return num_slots_; }
  // Pool slots currently handed out.
  size_t slots_in_use() const;
  // Overflow blocks currently alive, and ever allocated.
  size_t overflow_in_use() const;
  uint64_t overflow_total() const;
  // Bytes of slot memory alive now (pooled blocks created + live overflow).
  size_t resident_bytes() const;
  // True exactly once, after the first overflow allocation.
  bool take_overflow_warning();
  // Frees every idle pooled block (they are created again on demand).
  // Returns the bytes given back to the OS.
  size_t trim();

 private:
  friend class PoolSlot;
  BatchPool(size_t slot_bytes, size_t num_slots, std::shared_ptr<SlotMemoryHooks> hooks);
  // A new block, seen by the hooks (which see it again just before it is freed).
  std::shared_ptr<HeapStorage> allocate_block() const;
  void release(std::shared_ptr<HeapStorage> block, bool overflow) noexcept;

  const size_t slot_bytes_;
  const size_t num_slots_;
  const std::shared_ptr<SlotMemoryHooks> hooks_;
  const pid_t owner_pid_;  // in a forked child, released slots are not pooled
  mutable std::mutex mutex_;
  std::condition_variable returned_;
  std::vector<std::shared_ptr<HeapStorage>> free_;
  size_t created_ = 0;
  size_t in_use_ = 0;
  size_t overflow_in_use_ = 0;
  uint64_t overflow_total_ = 0;
  bool overflow_warning_pending_ = false;
  bool overflow_warned_ = false;
  bool hoarding_ = false;  // a wait for a slot went unanswered; no slot came back since
};

}  // namespace leanloader
