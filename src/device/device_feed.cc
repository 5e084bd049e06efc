#include "leanloader/device/device_feed.h"

#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "leanloader/core/checked_size.h"
#include "leanloader/core/error.h"

namespace leanloader {

namespace detail {

// Defined in `detail`, not an unnamed namespace: DeviceFeedState holds them
// and has external linkage.
struct DeviceBlock {
  std::byte* data = nullptr;
  DeviceRuntime::Event released = 0;  // recorded where the block's last batch was used
};

// An event shared by the batch waiting for delivery and the completion
// queue; destroyed by whichever lets go last.
class SharedEvent {
 public:
  explicit SharedEvent(std::shared_ptr<DeviceRuntime> runtime)
      : runtime_(std::move(runtime)), event_(runtime_->create_event()) {}
  ~SharedEvent() { runtime_->destroy_event(event_); }
  SharedEvent(const SharedEvent&) = delete;
  SharedEvent& operator=(const SharedEvent&) = delete;
  DeviceRuntime::Event get() const noexcept { return event_; }

 private:
  std::shared_ptr<DeviceRuntime> runtime_;
  DeviceRuntime::Event event_;
};

struct DeviceFeedState;

// The Storage of a device batch: one device block, returned to the feed's
// pool (fenced by an event on the stream that used it) when the last tensor
// viewing it dies.
class DeviceBlockStorage final : public Storage {
 public:
  DeviceBlockStorage(std::shared_ptr<DeviceFeedState> state, DeviceBlock block, bool overflow,
                     size_t bytes, DeviceLocation location)
      : Storage(block.data, bytes, StorageKind::kDevice),
        state_(std::move(state)),
        block_(block),
        overflow_(overflow),
        location_(location) {}
  ~DeviceBlockStorage() override;
  DeviceLocation device() const noexcept override { return location_; }
  // The stream the batch was delivered on: its work on the block is what the
  // block's reuse waits for.
  void delivered_on(DeviceRuntime::Stream stream) noexcept { consumer_.store(stream); }

 private:
  std::shared_ptr<DeviceFeedState> state_;
  DeviceBlock block_;
  bool overflow_;
  DeviceLocation location_;
  std::atomic<DeviceRuntime::Stream> consumer_{kUndelivered};

 public:
  static constexpr DeviceRuntime::Stream kUndelivered = ~DeviceRuntime::Stream{0};
};

struct DeviceFeedState {
  struct Ahead {
    Batch device;
    std::shared_ptr<SharedEvent> copied;
    std::shared_ptr<DeviceBlockStorage> storage;
  };
  struct Copy {
    std::shared_ptr<SharedEvent> copied;
    Batch host;  // holds the host slot until the copy is done
  };

  std::shared_ptr<DeviceRuntime> runtime;
  size_t block_bytes = 0;
  int prefetch = 0;
  size_t num_blocks = 0;
  DeviceRuntime::Stream copy_stream = 0;

  // Block pool.
  mutable std::mutex blocks_mutex;
  std::vector<DeviceBlock> free_blocks;
  size_t created = 0;
  size_t overflow_alive = 0;
  uint64_t overflow_total = 0;
  bool closed = false;

  // Completion queue, served by `completer`.
  std::mutex copies_mutex;
  std::condition_variable copies_changed;
  std::deque<Copy> copies;
  bool stopping = false;
  std::atomic<uint64_t> completed{0};
  std::thread completer;

  // The consumer thread's side.
  std::deque<Ahead> ahead;
  std::exception_ptr pending_error;
  bool host_ended = false;

  ~DeviceFeedState() { runtime->destroy_stream(copy_stream); }

  DeviceBlock new_block() {
    DeviceBlock block;
    block.data = runtime->allocate(block_bytes);
    try {
      block.released = runtime->create_event();
    } catch (...) {
      runtime->free(block.data);
      throw;
    }
    return block;
  }

  void free_block(const DeviceBlock& block) noexcept {
    runtime->synchronize(block.released);  // the consumer's last use is over
    runtime->destroy_event(block.released);
    runtime->free(block.data);
  }

  // A block for the next copy: pooled, new up to the plan, or overflow.
  std::pair<DeviceBlock, bool> acquire() {
    {
      std::lock_guard lock(blocks_mutex);
      if (!free_blocks.empty()) {
        DeviceBlock block = free_blocks.back();
        free_blocks.pop_back();
        return {block, false};
      }
    }
    bool overflow = false;
    {
      std::lock_guard lock(blocks_mutex);
      if (created < num_blocks) {
        ++created;
      } else {
        overflow = true;
        ++overflow_alive;
        ++overflow_total;
      }
    }
    try {
      return {new_block(), overflow};
    } catch (...) {
      std::lock_guard lock(blocks_mutex);
      if (overflow) {
        --overflow_alive;
      } else {
        --created;
      }
      throw;
    }
  }

  void release(const DeviceBlock& block, bool overflow, DeviceRuntime::Stream stream) noexcept {
    bool fenced = true;
    try {
      runtime->record(block.released, stream);
    } catch (...) {
      fenced = false;  // not reusable safely: freed below (freeing device memory syncs)
    }
    bool keep = false;
    {
      std::lock_guard lock(blocks_mutex);
      if (overflow) {
        --overflow_alive;
      } else if (!closed && fenced) {
        free_blocks.push_back(block);
        keep = true;
      } else {
        --created;
      }
    }
    if (!keep) free_block(block);
  }

  void complete_copies() {
    try {
      runtime->bind_thread();
    } catch (...) {
      // Each wait then makes the device current for itself.
    }
    std::unique_lock lock(copies_mutex);
    while (true) {
      copies_changed.wait(lock, [&] { return stopping || !copies.empty(); });
      if (copies.empty()) return;
      const std::shared_ptr<SharedEvent> copied = copies.front().copied;
      lock.unlock();
      runtime->synchronize(copied->get());
      lock.lock();
      Batch host = std::move(copies.front().host);
      copies.pop_front();
      lock.unlock();
      host = Batch();  // the host slot goes back to its BatchPool here
      completed.fetch_add(1);
      lock.lock();
    }
  }

  void enqueue_copy(Batch host, const std::shared_ptr<DeviceFeedState>& self) {
    if (!host.listed.empty()) {
      throw InvalidArgument(
          "a device feed needs stacked batches (collate='stack'): collate='list' batches have a "
          "tensor per sample");
    }
    for (const Tensor& tensor : host.stacked) {
      if (!tensor.storage()->device().is_cpu() || !tensor.is_contiguous()) {
        throw InvalidArgument("a device feed copies contiguous host tensors only");
      }
      const auto end = checked_add(tensor.byte_offset(), tensor.nbytes());
      if (!end || *end > block_bytes) {
        throw InvalidArgument("a batch field lies outside the " + std::to_string(block_bytes) +
                              "-byte block planned for it");
      }
    }
    auto [block, overflow] = acquire();
    auto storage = std::make_shared<DeviceBlockStorage>(self, block, overflow, block_bytes,
                                                        runtime->location());
    Batch device;
    device.batch_index = host.batch_index;
    device.indices = host.indices;
    device.warnings = std::move(host.warnings);
    runtime->wait(copy_stream, block.released);  // its previous batch is no longer used
    for (const Tensor& tensor : host.stacked) {
      runtime->copy_to_device(block.data + tensor.byte_offset(), tensor.data(), tensor.nbytes(),
                              copy_stream);
      device.stacked.emplace_back(storage, tensor.byte_offset(), tensor.dtype(), tensor.shape(),
                                  tensor.strides());
    }
    auto copied = std::make_shared<SharedEvent>(runtime);
    runtime->record(copied->get(), copy_stream);
    {
      std::lock_guard lock(copies_mutex);
      copies.push_back({copied, std::move(host)});
    }
    copies_changed.notify_all();
    ahead.push_back({std::move(device), std::move(copied), std::move(storage)});
  }

  void close() noexcept {
    ahead.clear();
    {
      std::lock_guard lock(copies_mutex);
      stopping = true;
    }
    copies_changed.notify_all();
    if (completer.joinable()) completer.join();  // every copy in flight finished
    std::vector<DeviceBlock> idle;
    {
      std::lock_guard lock(blocks_mutex);
      closed = true;
      idle.swap(free_blocks);
      created -= idle.size();
    }
    for (const DeviceBlock& block : idle) free_block(block);
  }
};

DeviceBlockStorage::~DeviceBlockStorage() {
  const DeviceRuntime::Stream stream = consumer_.load();
  state_->release(block_, overflow_, stream == kUndelivered ? state_->copy_stream : stream);
}

}  // namespace detail

DeviceFeed::DeviceFeed(std::shared_ptr<DeviceRuntime> runtime, size_t block_bytes,
                       int prefetch_to_device)
    : state_(std::make_shared<detail::DeviceFeedState>()) {
  if (!runtime) throw InvalidArgument("a device feed needs a device runtime");
  if (prefetch_to_device < 0) {
    throw InvalidArgument("prefetch_to_device must be >= 0, got " +
                          std::to_string(prefetch_to_device));
  }
  const size_t blocks = static_cast<size_t>(prefetch_to_device) + 2;
  if (!checked_mul(blocks, block_bytes)) {
    throw InvalidArgument("prefetch_to_device x batch bytes overflows");
  }
  state_->runtime = std::move(runtime);
  state_->block_bytes = block_bytes;
  state_->prefetch = prefetch_to_device;
  state_->num_blocks = blocks;
  state_->free_blocks.reserve(blocks);  // release() must not allocate
  state_->copy_stream = state_->runtime->create_stream();
  state_->completer = std::thread([state = state_.get()] { state->complete_copies(); });
}

DeviceFeed::~DeviceFeed() { state_->close(); }

EpochIterator::Status DeviceFeed::next(EpochIterator& host, Batch& out,
                                       DeviceRuntime::Stream consumer,
                                       std::chrono::milliseconds timeout) {
  detail::DeviceFeedState& state = *state_;
  if (state.ahead.empty()) {
    if (state.pending_error) {
      std::exception_ptr error = std::exchange(state.pending_error, nullptr);
      std::rethrow_exception(error);
    }
    if (state.host_ended) return EpochIterator::Status::kEnd;
    Batch batch;
    const EpochIterator::Status status = host.next(batch, timeout);
    if (status == EpochIterator::Status::kTimeout) return status;
    if (status == EpochIterator::Status::kEnd) {
      state.host_ended = true;
      return status;
    }
    state.enqueue_copy(std::move(batch), state_);
  }
  // Copy ahead what is ready: the copies overlap with the consumer's work.
  while (state.ahead.size() <= static_cast<size_t>(state.prefetch) && !state.host_ended &&
         !state.pending_error) {
    Batch batch;
    EpochIterator::Status status;
    try {
      status = host.next(batch, std::chrono::milliseconds(0));
    } catch (...) {
      state.pending_error = std::current_exception();  // after the batches before it
      break;
    }
    if (status == EpochIterator::Status::kEnd) state.host_ended = true;
    if (status != EpochIterator::Status::kBatch) break;
    state.enqueue_copy(std::move(batch), state_);
  }
  detail::DeviceFeedState::Ahead front = std::move(state.ahead.front());
  state.ahead.pop_front();
  front.storage->delivered_on(consumer);
  state.runtime->wait(consumer, front.copied->get());
  out = std::move(front.device);
  return EpochIterator::Status::kBatch;
}

void DeviceFeed::reset() {
  state_->ahead.clear();
  state_->pending_error = nullptr;
  state_->host_ended = false;
}

const DeviceRuntime& DeviceFeed::runtime() const noexcept { return *state_->runtime; }
size_t DeviceFeed::block_bytes() const noexcept { return state_->block_bytes; }
int DeviceFeed::prefetch_to_device() const noexcept { return state_->prefetch; }
size_t DeviceFeed::device_bill() const noexcept { return state_->num_blocks * state_->block_bytes; }

size_t DeviceFeed::device_resident_bytes() const {
  std::lock_guard lock(state_->blocks_mutex);
  return (state_->created + state_->overflow_alive) * state_->block_bytes;
}

uint64_t DeviceFeed::overflow_total() const {
  std::lock_guard lock(state_->blocks_mutex);
  return state_->overflow_total;
}

uint64_t DeviceFeed::copies_completed() const { return state_->completed.load(); }

}  // namespace leanloader
