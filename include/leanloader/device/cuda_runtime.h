// CudaRuntime: the DeviceRuntime of one NVIDIA GPU through the CUDA runtime
// library, loaded when first asked for (dlopen) rather than linked: leanloader
// builds, imports and runs without CUDA, and in a process where torch with
// CUDA is imported, dlopen by soname finds the libcudart torch loaded.
//
// Every call makes the runtime's device current for the call and then puts
// the thread's previous device back (cudaSetDevice is per thread, and a call
// may come from the user's thread: a batch dropped in the training loop);
// the loader's own threads bind_thread() instead, so that they never make a
// context on another device. Failures are leanloader Errors naming the call
// and CUDA's own message.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <memory>
#include <string>

#include "leanloader/device/device_runtime.h"

namespace leanloader {

namespace detail {
struct CudaApi;
}  // namespace detail

class CudaRuntime final : public DeviceRuntime {
 public:
  // The runtime of GPU `device_index`. Throws Error when libcudart cannot be
  // loaded (no NVIDIA GPU / driver, no CUDA build of torch), when it lacks an
  // entry point, or when the device does not exist.
  static std::shared_ptr<CudaRuntime> load(int device_index);
  // Whether libcudart can be loaded and sees at least one device (never throws).
  static int device_count() noexcept;

  std::string name() const override { return "cuda:" + std::to_string(device_index_); }
  DeviceLocation location() const override { return {DeviceLocation::Type::kCuda, device_index_}; }

  void bind_thread() override;
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

 private:
  CudaRuntime(const detail::CudaApi* api, int device_index)
      : api_(api), device_index_(device_index) {}

  const detail::CudaApi* api_;
  int device_index_;
};

}  // namespace leanloader
