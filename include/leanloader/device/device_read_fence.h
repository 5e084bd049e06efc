// DeviceReadFence: the SlotReleaseFence of page-locked batch slots that a
// device reads by asynchronous copies the loader does not issue itself:
// ll.DataLoader(pin_memory=True) registers its shared batch segments in place
// (no pin copy), and the user's `.to(device, non_blocking=True)` then reads a
// segment after next() returned, possibly after the batch's tensors are gone.
// torch fences its own pinned blocks with an event on the copy's stream; it
// records nothing for memory it did not allocate, so this fence does.
//
// When a slot's last view is gone, an event is recorded on every stream such
// a copy may have been queued on: the streams the consumer had current when
// it took batches (note_consumer_stream), and those current where batches
// were dropped (the `current_stream` callback, asked at each release, when it
// knows one), this release's included; up to kMaxStreams distinct streams are
// remembered, and a stream the runtime refuses (destroyed since) is
// forgotten. A copy queued on a stream the fence has never seen (a batch
// copied under another stream and dropped elsewhere, the first time) is not
// covered (docs/gpu.md says so).
//
// A thread of the fence waits for those events; it never runs the releases'
// callbacks itself, because they let go of memory whose owners may need the
// caller's locks (Python objects need the GIL): collect() runs the callbacks
// of completed releases on the caller's thread, and ready_fd() becomes
// readable when there are some. The destructor waits for every pending event
// and runs the remaining callbacks.
//
// Thread-safety: every method may be called from any thread; callbacks run
// on the thread that calls collect() or the destructor.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "leanloader/device/device_runtime.h"
#include "leanloader/workers/slot_release_fence.h"

namespace leanloader {

class DeviceReadFence final : public SlotReleaseFence {
 public:
  // The stream current on the calling thread, or nullopt when it cannot be
  // known there. Must not throw.
  using CurrentStream = std::function<std::optional<DeviceRuntime::Stream>()>;
  static constexpr size_t kMaxStreams = 64;

  // Throws IoError when no eventfd can be made.
  explicit DeviceReadFence(std::shared_ptr<DeviceRuntime> runtime,
                           CurrentStream current_stream = {});
  ~DeviceReadFence() override;
  DeviceReadFence(const DeviceReadFence&) = delete;
  DeviceReadFence& operator=(const DeviceReadFence&) = delete;

  // The consumer took a batch with `stream` current: releases from now on
  // also fence that stream.
  void note_consumer_stream(DeviceRuntime::Stream stream);
  void after_pending_reads(std::function<void()> then) noexcept override;

  // Runs the callbacks of the releases whose reads are over; returns how many.
  size_t collect();
  // Readable (an eventfd) while completed releases wait for collect().
  int ready_fd() const noexcept { return ready_fd_; }

  // Releases whose reads may still run, completed ones not yet collected,
  // and every release so far.
  size_t pending() const;
  size_t completed() const;
  uint64_t fenced_total() const;

 private:
  struct Release {
    std::vector<DeviceRuntime::Event> events;
    std::function<void()> then;
  };
  void wait_for_releases();
  void remember(DeviceRuntime::Stream stream);  // with mutex_ held
  void forget(DeviceRuntime::Stream stream);
  DeviceRuntime::Event take_event();
  void signal_ready() noexcept;

  std::shared_ptr<DeviceRuntime> runtime_;
  CurrentStream current_stream_;
  int ready_fd_ = -1;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<DeviceRuntime::Stream> consumer_streams_;
  std::vector<DeviceRuntime::Event> free_events_;
  std::deque<Release> waiting_;    // events recorded, not all complete yet
  std::deque<Release> completed_;  // for collect()
  bool in_progress_ = false;       // the thread is waiting on one release
  bool stopping_ = false;
  uint64_t fenced_total_ = 0;
  std::thread waiter_;
};

}  // namespace leanloader
