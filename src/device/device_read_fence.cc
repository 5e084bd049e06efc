#include "leanloader/device/device_read_fence.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "leanloader/core/error.h"

namespace leanloader {

DeviceReadFence::DeviceReadFence(std::shared_ptr<DeviceRuntime> runtime,
                                 CurrentStream current_stream)
    : runtime_(std::move(runtime)), current_stream_(std::move(current_stream)) {
  ready_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (ready_fd_ < 0) {
    throw IoError("cannot make an eventfd for", "a device read fence", errno);
  }
  try {
    waiter_ = std::thread([this] { wait_for_releases(); });
  } catch (...) {
    ::close(ready_fd_);
    throw;
  }
}

DeviceReadFence::~DeviceReadFence() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  waiter_.join();  // every release's events completed
  collect();
  for (const DeviceRuntime::Event event : free_events_) runtime_->destroy_event(event);
  ::close(ready_fd_);
}

void DeviceReadFence::note_consumer_stream(DeviceRuntime::Stream stream) {
  std::lock_guard lock(mutex_);
  remember(stream);
}

void DeviceReadFence::remember(DeviceRuntime::Stream stream) {
  if (consumer_streams_.size() < kMaxStreams &&
      std::find(consumer_streams_.begin(), consumer_streams_.end(), stream) ==
          consumer_streams_.end()) {
    consumer_streams_.push_back(stream);
  }
}

void DeviceReadFence::forget(DeviceRuntime::Stream stream) {
  std::lock_guard lock(mutex_);
  std::erase(consumer_streams_, stream);
}

DeviceRuntime::Event DeviceReadFence::take_event() {
  {
    std::lock_guard lock(mutex_);
    if (!free_events_.empty()) {
      const DeviceRuntime::Event event = free_events_.back();
      free_events_.pop_back();
      return event;
    }
  }
  return runtime_->create_event();
}

void DeviceReadFence::signal_ready() noexcept {
  const uint64_t one = 1;
  // A full counter (2^64 - 2 signals never collected) is still readable.
  [[maybe_unused]] const ssize_t written = ::write(ready_fd_, &one, sizeof(one));
}

void DeviceReadFence::after_pending_reads(std::function<void()> then) noexcept {
  // Outside the lock: the callback may ask Python (torch) for its stream.
  const std::optional<DeviceRuntime::Stream> current =
      current_stream_ ? current_stream_() : std::nullopt;
  Release release;
  bool nothing_to_wait_for = false;
  try {
    std::vector<DeviceRuntime::Stream> streams;
    {
      std::lock_guard lock(mutex_);
      if (current) remember(*current);
      streams = consumer_streams_;
    }
    if (current && std::find(streams.begin(), streams.end(), *current) == streams.end()) {
      streams.push_back(*current);  // beyond kMaxStreams: this release only
    }
    release.events.reserve(streams.size());
    for (const DeviceRuntime::Stream stream : streams) {
      const DeviceRuntime::Event event = take_event();
      try {
        runtime_->record(event, stream);
        release.events.push_back(event);
      } catch (...) {
        // A stream the runtime refuses (destroyed since it was seen): nothing
        // more can be queued on it; the other streams still fence the slot.
        runtime_->destroy_event(event);
        forget(stream);
      }
    }
    std::lock_guard lock(mutex_);
    ++fenced_total_;
    nothing_to_wait_for = release.events.empty();
    if (nothing_to_wait_for) {
      completed_.push_back({{}, std::move(then)});
    } else {
      release.then = std::move(then);
      waiting_.push_back(std::move(release));
    }
  } catch (...) {
    // Out of memory or no event to be had: the release cannot be queued. The
    // slot is given back when the events recorded so far complete: they are
    // waited for here, on the caller's thread.
    for (const DeviceRuntime::Event event : release.events) {
      try {
        runtime_->synchronize(event);
      } catch (...) {
      }
      runtime_->destroy_event(event);
    }
    if (then) {
      then();
    } else if (release.then) {
      release.then();  // (moved there before the queue refused it)
    }
    return;
  }
  if (nothing_to_wait_for) {
    signal_ready();
  } else {
    changed_.notify_all();
  }
}

void DeviceReadFence::wait_for_releases() {
  try {
    runtime_->bind_thread();
  } catch (...) {
    // Each wait then makes the device current for itself.
  }
  std::unique_lock lock(mutex_);
  for (;;) {
    changed_.wait(lock, [this] { return stopping_ || !waiting_.empty(); });
    if (waiting_.empty()) return;  // stopping, nothing left
    Release release = std::move(waiting_.front());
    waiting_.pop_front();
    in_progress_ = true;
    lock.unlock();
    for (const DeviceRuntime::Event event : release.events) {
      try {
        runtime_->synchronize(event);
      } catch (...) {
        // The runtime's context failed: the work before the event will not
        // run any more, so it reads nothing more.
      }
    }
    lock.lock();
    in_progress_ = false;
    free_events_.insert(free_events_.end(), release.events.begin(), release.events.end());
    release.events.clear();
    completed_.push_back(std::move(release));  // the callback runs in collect()
    signal_ready();
  }
}

size_t DeviceReadFence::collect() {
  std::deque<Release> done;
  {
    std::lock_guard lock(mutex_);
    done.swap(completed_);
    uint64_t count = 0;
    [[maybe_unused]] const ssize_t read = ::read(ready_fd_, &count, sizeof(count));
  }
  for (Release& release : done) release.then();
  return done.size();
}

size_t DeviceReadFence::pending() const {
  std::lock_guard lock(mutex_);
  return waiting_.size() + (in_progress_ ? 1 : 0);
}

size_t DeviceReadFence::completed() const {
  std::lock_guard lock(mutex_);
  return completed_.size();
}

uint64_t DeviceReadFence::fenced_total() const {
  std::lock_guard lock(mutex_);
  return fenced_total_;
}

}  // namespace leanloader
