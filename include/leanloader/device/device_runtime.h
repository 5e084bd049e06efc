// DeviceRuntime: the few operations of an accelerator runtime the loader's
// device feed needs — page-lock host memory in place, device memory, streams,
// events, asynchronous host-to-device copies — behind one interface, so the
// ordering logic (device/device_feed.h) is the same code on a GPU (CUDA,
// device/cuda_runtime.h) and on the CPU stand-in the tests run everywhere
// (device/host_stand_in_runtime.h).
//
// Semantics are CUDA's: operations enqueued on one stream run in order;
// record(event, stream) marks the point reached by the work enqueued so far;
// wait(stream, event) makes later work on `stream` wait for that point
// (without blocking the host); done/synchronize query or wait on the host.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "leanloader/core/device_location.h"

namespace leanloader {

class DeviceRuntime {
 public:
  using Stream = uintptr_t;  // 0 is CUDA's legacy default stream
  using Event = uintptr_t;

  virtual ~DeviceRuntime() = default;

  // "cuda:0", "host-stand-in"
  virtual std::string name() const = 0;
  // Where device memory of this runtime lives (and how DLPack names it).
  virtual DeviceLocation location() const = 0;

  // Page-locks [data, data + bytes) in place, so copies from it are DMA
  // without a staging copy; unregister before the memory is freed.
  // A thread of the loader's own that uses this runtime calls this first:
  // the runtime's device stays current on it (nothing to restore later).
  // Throws when the device cannot be made current.
  virtual void bind_thread() {}

  virtual void register_host(std::byte* data, size_t bytes) = 0;
  virtual void unregister_host(std::byte* data) noexcept = 0;

  virtual std::byte* allocate(size_t bytes) = 0;
  virtual void free(std::byte* data) noexcept = 0;

  virtual Stream create_stream() = 0;
  virtual void destroy_stream(Stream stream) noexcept = 0;
  virtual Event create_event() = 0;
  virtual void destroy_event(Event event) noexcept = 0;

  virtual void copy_to_device(std::byte* device, const std::byte* host, size_t bytes,
                              Stream stream) = 0;
  virtual void record(Event event, Stream stream) = 0;
  virtual void wait(Stream stream, Event event) = 0;
  // Whether the work before the event's last record() has finished (true
  // for an event never recorded).
  virtual bool done(Event event) = 0;
  virtual void synchronize(Event event) = 0;
};

}  // namespace leanloader
