#include "leanloader/device/device_read_fence.h"

#include <algorithm>
#include <utility>

namespace leanloader {

DeviceReadFence::DeviceReadFence(std::shared_ptr<DeviceRuntime> runtime,
                                 CurrentStream current_stream)
    : runtime_(std::move(runtime)), current_stream_(std::move(current_stream)) {
  completer_ = std::thread([this] { complete_releases(); });
}

DeviceReadFence::~DeviceReadFence() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  completer_.join();  // every pending release was completed
  for (const DeviceRuntime::Event event : free_events_) runtime_->destroy_event(event);
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

void DeviceReadFence::after_pending_reads(std::function<void()> then) noexcept {
  // Outside the lock: the callback may ask Python (torch) for its stream.
  const std::optional<DeviceRuntime::Stream> current =
      current_stream_ ? current_stream_() : std::nullopt;
  Release release;
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
    for (const DeviceRuntime::Stream stream : streams) {
      const DeviceRuntime::Event event = take_event();
      release.events.push_back(event);
      runtime_->record(event, stream);
    }
    release.then = std::move(then);
    {
      std::lock_guard lock(mutex_);
      releases_.push_back(std::move(release));
      ++fenced_total_;
    }
    changed_.notify_all();
  } catch (...) {
    // The runtime failed to record (its context is gone: nothing it queued
    // will run) or memory ran out: nothing can still read the slot through
    // the events recorded so far in a way that waiting would fix. Give back
    // now rather than never.
    for (const DeviceRuntime::Event event : release.events) runtime_->destroy_event(event);
    if (then) then();
  }
}

void DeviceReadFence::complete_releases() {
  std::unique_lock lock(mutex_);
  for (;;) {
    changed_.wait(lock, [this] { return stopping_ || !releases_.empty(); });
    if (releases_.empty()) return;  // stopping, nothing left
    Release release = std::move(releases_.front());
    releases_.pop_front();
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
    release.then();
    lock.lock();
    in_progress_ = false;
    free_events_.insert(free_events_.end(), release.events.begin(), release.events.end());
  }
}

size_t DeviceReadFence::pending() const {
  std::lock_guard lock(mutex_);
  return releases_.size() + (in_progress_ ? 1 : 0);
}

uint64_t DeviceReadFence::fenced_total() const {
  std::lock_guard lock(mutex_);
  return fenced_total_;
}

}  // namespace leanloader
