// HostStandInRuntime: a DeviceRuntime made of host memory and threads, with
// CUDA's ordering semantics, for testing the device feed without a GPU.
//
// Each stream is a thread running its queued operations in order; an event
// completes when its stream reaches it; "device" memory is heap memory (so
// batches come back as CPU tensors); copies are memcpy. Nothing is faked
// away: a copy that has not run yet has not copied, a stream that waits on
// an event really waits. Tests add their own work (enqueue, delay) to make
// orderings observable.
//
// Thread-safety: every method may be called from any thread. An event may be
// destroyed while operations that use it are queued (as in CUDA, they keep
// its state); a stream is destroyed after its last use (its queue runs
// first). The runtime joins its default stream's thread when destroyed.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>

#include "leanloader/device/device_runtime.h"

namespace leanloader {

class HostStandInRuntime final : public DeviceRuntime {
 public:
  HostStandInRuntime();
  ~HostStandInRuntime() override;

  std::string name() const override { return "host-stand-in"; }
  DeviceLocation location() const override { return {}; }

  void register_host(std::byte* data, size_t bytes) override;
  void unregister_host(std::byte* data) noexcept override;
  std::byte* allocate(size_t bytes) override;
  void free(std::byte* data) noexcept override;
  Stream create_stream() override;
  void destroy_stream(Stream stream) noexcept override;
  Event create_event() override;
  void destroy_event(Event event) noexcept override;
  void copy_to_device(std::byte* device, const std::byte* host, size_t bytes,
                      Stream stream) override;
  void record(Event event, Stream stream) override;
  void wait(Stream stream, Event event) override;
  bool done(Event event) override;
  void synchronize(Event event) override;

  // Test hooks: run `work` on `stream` in order with its other operations;
  // hold `stream` for `duration`.
  void enqueue(Stream stream, std::function<void()> work);
  void delay(Stream stream, std::chrono::milliseconds duration);
  // Every copy enqueued from now on first holds its stream for `duration`
  // (a slow transfer, observable from the host and from other streams).
  void delay_copies(std::chrono::milliseconds duration);
  // Blocks until every operation enqueued on `stream` so far has run.
  void drain(Stream stream);

  // Host bytes registered now, and the number of register calls ever made.
  size_t registered_bytes() const;
  uint64_t registrations() const;
  size_t allocated_bytes() const;

  class StreamThread;
  struct EventState;

 private:
  StreamThread& stream_of(Stream stream);

  std::unique_ptr<StreamThread> default_stream_;
  mutable std::mutex mutex_;
  std::map<std::byte*, size_t> registered_;
  std::map<std::byte*, size_t> allocated_;
  uint64_t registrations_ = 0;
  std::chrono::milliseconds copy_delay_{0};
};

}  // namespace leanloader
