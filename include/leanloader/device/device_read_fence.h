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
// remembered. A completion thread gives the slot back once every one of those
// events has completed. A copy queued on a stream the fence has never seen (a
// batch copied under another stream and dropped elsewhere, the first time)
// is not covered (docs/gpu.md says so).
//
// Thread-safety: every method may be called from any thread. The destructor
// waits for the pending events and runs their callbacks.
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

  explicit DeviceReadFence(std::shared_ptr<DeviceRuntime> runtime,
                           CurrentStream current_stream = {});
  ~DeviceReadFence() override;
  DeviceReadFence(const DeviceReadFence&) = delete;
  DeviceReadFence& operator=(const DeviceReadFence&) = delete;

  static constexpr size_t kMaxStreams = 64;

  // The consumer took a batch with `stream` current: releases from now on
  // also fence that stream.
  void note_consumer_stream(DeviceRuntime::Stream stream);
  void after_pending_reads(std::function<void()> then) noexcept override;

  // Releases waiting for their events now; releases fenced so far.
  size_t pending() const;
  uint64_t fenced_total() const;

 private:
  struct Release {
    std::vector<DeviceRuntime::Event> events;
    std::function<void()> then;
  };
  void complete_releases();
  void remember(DeviceRuntime::Stream stream);  // with mutex_ held
  DeviceRuntime::Event take_event();

  std::shared_ptr<DeviceRuntime> runtime_;
  CurrentStream current_stream_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<DeviceRuntime::Stream> consumer_streams_;
  std::vector<DeviceRuntime::Event> free_events_;
  std::deque<Release> releases_;
  bool in_progress_ = false;  // the completion thread is waiting on one release
  bool stopping_ = false;
  uint64_t fenced_total_ = 0;
  std::thread completer_;
};

}  // namespace leanloader
