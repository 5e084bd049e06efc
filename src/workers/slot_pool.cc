#include "leanloader/workers/slot_pool.h"

#include <functional>
#include <string>

#include "leanloader/core/error.h"

namespace leanloader {

namespace {
constexpr size_t kSlotAlignment = 4096;
}  // namespace

// A held slot: the bytes of one slot, returned to the pool on destruction.
// Holds the pool (and so the segment) alive.
class SlotStorage final : public Storage {
 public:
  SlotStorage(std::shared_ptr<SlotPool> pool, size_t slot, std::shared_ptr<SlotReleaseFence> fence)
      : Storage(pool->segment()->data() + pool->slot_offset(slot), pool->slot_bytes(),
                StorageKind::kPoolSlot),
        pool_(std::move(pool)),
        slot_(slot),
        fence_(std::move(fence)) {}
  ~SlotStorage() override {
    if (fence_ == nullptr) {
      pool_->give_back(slot_);
      return;
    }
    std::function<void()> give_back;
    try {
      give_back = [pool = pool_, slot = slot_] { pool->give_back(slot); };
    } catch (...) {
      // No memory for the callback: the slot stays out of use (lost to this
      // pool). Were this the pool's last reference, the pool would go now,
      // even under a pending read: out of memory, nothing here can wait.
      return;
    }
    fence_->after_pending_reads(std::move(give_back));
  }

 private:
  std::shared_ptr<SlotPool> pool_;
  size_t slot_;
  std::shared_ptr<SlotReleaseFence> fence_;
};

std::shared_ptr<SlotPool> SlotPool::create(size_t slot_bytes, size_t num_slots,
                                           const std::string& dir) {
  if (slot_bytes == 0 || num_slots == 0) {
    throw InvalidArgument("a slot pool needs slot_bytes and num_slots above 0, got " +
                          std::to_string(slot_bytes) + " and " + std::to_string(num_slots));
  }
  const size_t rounded = (slot_bytes + kSlotAlignment - 1) / kSlotAlignment * kSlotAlignment;
  if (num_slots > SIZE_MAX / rounded) {
    throw InvalidArgument("slot pool of " + std::to_string(num_slots) + " x " +
                          std::to_string(rounded) + " bytes overflows");
  }
  auto segment = SharedSegment::create(rounded * num_slots, dir);
  return std::shared_ptr<SlotPool>(new SlotPool(std::move(segment), rounded, num_slots));
}

std::shared_ptr<SlotPool> SlotPool::adopt(std::shared_ptr<SharedSegment> segment, size_t slot_bytes,
                                          size_t num_slots,
                                          std::shared_ptr<SlotMemoryHooks> hooks) {
  if (segment == nullptr) throw InvalidArgument("cannot adopt a null segment as a slot pool");
  if (slot_bytes == 0 || num_slots == 0) {
    throw InvalidArgument("a slot pool needs slot_bytes and num_slots above 0, got " +
                          std::to_string(slot_bytes) + " and " + std::to_string(num_slots));
  }
  if (num_slots > segment->size() / slot_bytes) {
    throw InvalidArgument("a slot pool of " + std::to_string(num_slots) + " x " +
                          std::to_string(slot_bytes) + " bytes does not fit segment " +
                          segment->path() + " of " + std::to_string(segment->size()) + " bytes");
  }
  auto pool = std::shared_ptr<SlotPool>(new SlotPool(std::move(segment), slot_bytes, num_slots));
  if (hooks != nullptr) {
    hooks->on_create(pool->segment_->data(), pool->segment_->size());
    pool->hooks_ = std::move(hooks);  // undone by the destructor from here on
  }
  return pool;
}

SlotPool::SlotPool(std::shared_ptr<SharedSegment> segment, size_t slot_bytes, size_t num_slots)
    : segment_(std::move(segment)),
      slot_bytes_(slot_bytes),
      num_slots_(num_slots),
      acquired_(num_slots, false) {
  free_.reserve(num_slots);
  for (size_t i = num_slots; i > 0; --i) free_.push_back(i - 1);  // slot 0 first
}

SlotPool::~SlotPool() {
  if (hooks_ != nullptr) hooks_->on_destroy(segment_->data(), segment_->size());
}

std::optional<size_t> SlotPool::acquire() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (free_.empty()) return std::nullopt;
  const size_t slot = free_.back();
  free_.pop_back();
  acquired_[slot] = true;
  return slot;
}

void SlotPool::check_slot(size_t slot, const char* what) const {
  if (slot >= num_slots_) {
    throw InvalidArgument(std::string("cannot ") + what + " slot " + std::to_string(slot) +
                          " of a pool of " + std::to_string(num_slots_) + " slots");
  }
  if (!acquired_[slot]) {
    throw InvalidArgument(std::string("cannot ") + what + " slot " + std::to_string(slot) +
                          ": it is not acquired");
  }
}

void SlotPool::release(size_t slot) {
  std::lock_guard<std::mutex> lock(mutex_);
  check_slot(slot, "release");
  acquired_[slot] = false;
  free_.push_back(slot);
}

std::shared_ptr<Storage> SlotPool::hold(size_t slot, std::shared_ptr<SlotReleaseFence> fence) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    check_slot(slot, "hold");
  }
  return std::make_shared<SlotStorage>(shared_from_this(), slot, std::move(fence));
}

void SlotPool::give_back(size_t slot) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  acquired_[slot] = false;
  free_.push_back(slot);
}

size_t SlotPool::slots_in_use() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return num_slots_ - free_.size();
}

}  // namespace leanloader
