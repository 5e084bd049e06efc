#include "leanloader/pipeline/batch_pool.h"

#include <unistd.h>

#include <algorithm>

namespace leanloader {

// The Storage handed to consumers: views a pooled (or overflow) block and
// gives it back on destruction.
class PoolSlot final : public Storage {
 public:
  PoolSlot(std::shared_ptr<BatchPool> pool, std::shared_ptr<HeapStorage> block, bool overflow)
      : Storage(block->data(), block->size(), StorageKind::kPoolSlot),
        pool_(std::move(pool)),
        block_(std::move(block)),
        overflow_(overflow) {}
  ~PoolSlot() override { pool_->release(std::move(block_), overflow_); }

 private:
  std::shared_ptr<BatchPool> pool_;
  std::shared_ptr<HeapStorage> block_;
  bool overflow_;
};

BatchPool::BatchPool(size_t slot_bytes, size_t num_slots, std::shared_ptr<SlotMemoryHooks> hooks)
    : slot_bytes_(slot_bytes),
      num_slots_(num_slots),
      hooks_(std::move(hooks)),
      owner_pid_(::getpid()) {}

std::shared_ptr<BatchPool> BatchPool::create(size_t slot_bytes, size_t num_slots,
                                             std::shared_ptr<SlotMemoryHooks> hooks) {
  std::shared_ptr<BatchPool> pool(new BatchPool(slot_bytes, num_slots, std::move(hooks)));
  pool->free_.reserve(num_slots);  // release() must not allocate
  return pool;
}

std::shared_ptr<HeapStorage> BatchPool::allocate_block() const {
  std::shared_ptr<HeapStorage> block = HeapStorage::allocate(slot_bytes_);
  if (!hooks_) return block;
  hooks_->on_create(block->data(), block->size());  // a throw frees the block
  // The hooks see the block again just before its memory goes: the deleter
  // runs wherever the last reference dies (release(), trim(), the pool's end).
  HeapStorage* raw = block.get();
  return std::shared_ptr<HeapStorage>(
      raw, [hooks = hooks_, owner = std::move(block)](HeapStorage* b) mutable noexcept {
        hooks->on_destroy(b->data(), b->size());
        owner.reset();
      });
}

std::shared_ptr<Storage> BatchPool::acquire(std::chrono::milliseconds patience, size_t wanted) {
  std::shared_ptr<HeapStorage> block;
  bool overflow = false;
  {
    std::unique_lock lock(mutex_);
    const size_t without_waiting = std::min(wanted, num_slots_);
    if (free_.empty() && created_ >= without_waiting && patience.count() > 0 && !hoarding_) {
      // A consumer that kept its batches past one whole patience (list(loader))
      // is not waited for again until it gives a slot back.
      hoarding_ = !returned_.wait_for(lock, patience,
                                      [&] { return !free_.empty() || created_ < without_waiting; });
    }
    if (!free_.empty()) {
      block = std::move(free_.back());
      free_.pop_back();
      ++in_use_;
    } else if (created_ < num_slots_) {
      ++created_;
      ++in_use_;
    } else {
      overflow = true;
      ++overflow_in_use_;
      ++overflow_total_;
      if (!overflow_warned_) {
        overflow_warned_ = true;
        overflow_warning_pending_ = true;
      }
    }
  }
  if (block == nullptr) {
    try {
      block = allocate_block();
    } catch (...) {
      std::lock_guard lock(mutex_);
      if (overflow) {
        --overflow_in_use_;
      } else {
        --created_;
        --in_use_;
      }
      throw;
    }
  }
  return std::make_shared<PoolSlot>(shared_from_this(), std::move(block), overflow);
}

void BatchPool::release(std::shared_ptr<HeapStorage> block, bool overflow) noexcept {
  // A forked child may have inherited the mutex locked: free the block
  // instead of pooling it (the child's pool is never used again).
  if (::getpid() != owner_pid_) return;
  {
    std::lock_guard lock(mutex_);
    if (overflow) {
      --overflow_in_use_;
      return;  // `block` is freed as it goes out of scope
    }
    --in_use_;
    free_.push_back(std::move(block));
    hoarding_ = false;
  }
  returned_.notify_one();
}

size_t BatchPool::slots_in_use() const {
  std::lock_guard lock(mutex_);
  return in_use_;
}

size_t BatchPool::overflow_in_use() const {
  std::lock_guard lock(mutex_);
  return overflow_in_use_;
}

uint64_t BatchPool::overflow_total() const {
  std::lock_guard lock(mutex_);
  return overflow_total_;
}

size_t BatchPool::resident_bytes() const {
  std::lock_guard lock(mutex_);
  return (created_ + overflow_in_use_) * slot_bytes_;
}

size_t BatchPool::trim() {
  std::vector<std::shared_ptr<HeapStorage>> idle;
  {
    std::lock_guard lock(mutex_);
    idle.swap(free_);
    free_.reserve(num_slots_);
    created_ -= idle.size();
  }
  returned_.notify_all();            // trimmed slots may be created again
  return idle.size() * slot_bytes_;  // the blocks are unmapped as `idle` dies
}

bool BatchPool::take_overflow_warning() {
  std::lock_guard lock(mutex_);
  const bool pending = overflow_warning_pending_;
  overflow_warning_pending_ = false;
  return pending;
}

}  // namespace leanloader
