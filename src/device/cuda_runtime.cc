#include "leanloader/device/cuda_runtime.h"

#include <dlfcn.h>

#include <mutex>
#include <new>
#include <string>

#include "leanloader/core/error.h"

namespace leanloader {

namespace detail {

// The CUDA runtime API's types and constants, declared here so that no CUDA
// header is needed to build (values from the CUDA runtime API reference:
// cuda_runtime_api.h / driver_types.h, stable across CUDA 11-13).
using CudaError = int;  // cudaError_t; cudaSuccess = 0
constexpr CudaError kCudaSuccess = 0;
constexpr CudaError kCudaErrorNotReady = 600;  // cudaErrorNotReady
using CudaStream = void*;                      // cudaStream_t
using CudaEvent = void*;                       // cudaEvent_t
constexpr unsigned kCudaHostRegisterPortable = 0x01;
constexpr unsigned kCudaStreamNonBlocking = 0x01;
constexpr unsigned kCudaEventBlockingSync = 0x01;
constexpr unsigned kCudaEventDisableTiming = 0x02;
constexpr int kCudaMemcpyHostToDevice = 1;

struct CudaApi {
  void* library = nullptr;
  CudaError (*set_device)(int) = nullptr;
  CudaError (*get_device)(int*) = nullptr;
  CudaError (*get_device_count)(int*) = nullptr;
  const char* (*get_error_string)(CudaError) = nullptr;
  CudaError (*host_register)(void*, size_t, unsigned) = nullptr;
  CudaError (*host_unregister)(void*) = nullptr;
  CudaError (*malloc)(void**, size_t) = nullptr;
  CudaError (*free)(void*) = nullptr;
  CudaError (*stream_create_with_flags)(CudaStream*, unsigned) = nullptr;
  CudaError (*stream_destroy)(CudaStream) = nullptr;
  CudaError (*event_create_with_flags)(CudaEvent*, unsigned) = nullptr;
  CudaError (*event_destroy)(CudaEvent) = nullptr;
  CudaError (*event_record)(CudaEvent, CudaStream) = nullptr;
  CudaError (*stream_wait_event)(CudaStream, CudaEvent, unsigned) = nullptr;
  CudaError (*event_query)(CudaEvent) = nullptr;
  CudaError (*event_synchronize)(CudaEvent) = nullptr;
  CudaError (*memcpy_async)(void*, const void*, size_t, int, CudaStream) = nullptr;
  std::string load_error;  // why the API is unusable; empty when it is usable
};

namespace {

// Sonames tried in order: the runtimes of current CUDA major versions, then
// the unversioned development link.
constexpr const char* kLibraryNames[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0",
                                         "libcudart.so"};

template <class Function>
bool resolve(CudaApi& api, Function& function, const char* symbol) {
  function = reinterpret_cast<Function>(::dlsym(api.library, symbol));
  if (function == nullptr) {
    api.load_error = std::string("libcudart has no ") + symbol;
    return false;
  }
  return true;
}

CudaApi load_api() {
  CudaApi api;
  std::string tried;
  for (const char* name : kLibraryNames) {
    api.library = ::dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (api.library != nullptr) break;
    const char* why = ::dlerror();
    tried += std::string(tried.empty() ? "" : "; ") + (why != nullptr ? why : name);
  }
  if (api.library == nullptr) {
    api.load_error = "libcudart could not be loaded (" + tried + ")";
    return api;
  }
  const bool complete = resolve(api, api.set_device, "cudaSetDevice") &&
                        resolve(api, api.get_device, "cudaGetDevice") &&
                        resolve(api, api.get_device_count, "cudaGetDeviceCount") &&
                        resolve(api, api.get_error_string, "cudaGetErrorString") &&
                        resolve(api, api.host_register, "cudaHostRegister") &&
                        resolve(api, api.host_unregister, "cudaHostUnregister") &&
                        resolve(api, api.malloc, "cudaMalloc") &&
                        resolve(api, api.free, "cudaFree") &&
                        resolve(api, api.stream_create_with_flags, "cudaStreamCreateWithFlags") &&
                        resolve(api, api.stream_destroy, "cudaStreamDestroy") &&
                        resolve(api, api.event_create_with_flags, "cudaEventCreateWithFlags") &&
                        resolve(api, api.event_destroy, "cudaEventDestroy") &&
                        resolve(api, api.event_record, "cudaEventRecord") &&
                        resolve(api, api.stream_wait_event, "cudaStreamWaitEvent") &&
                        resolve(api, api.event_query, "cudaEventQuery") &&
                        resolve(api, api.event_synchronize, "cudaEventSynchronize") &&
                        resolve(api, api.memcpy_async, "cudaMemcpyAsync");
  if (!complete) {
    ::dlclose(api.library);
    api.library = nullptr;
  }
  return api;
}

// Loaded once per process and kept (libcudart is never unloaded).
const CudaApi& api() {
  static const CudaApi loaded = load_api();
  return loaded;
}

}  // namespace

}  // namespace detail

namespace {

void check(const detail::CudaApi& api, detail::CudaError status, const char* call) {
  if (status == detail::kCudaSuccess) return;
  const char* text = api.get_error_string != nullptr ? api.get_error_string(status) : nullptr;
  throw Error(std::string("CUDA: ") + call + " failed: " + (text != nullptr ? text : "error") +
                  " (cudaError " + std::to_string(status) + ")",
              ErrorKind::kGeneric);
}

// The device bound to this thread by bind_thread(), or -1.
thread_local int bound_device = -1;

// Makes the runtime's GPU current on this thread for one call and puts the
// thread's previous device back afterwards: the calling thread is often the
// user's (a batch dropped in the training loop), whose current device torch
// and the user's code rely on. A thread bound to the device is left alone.
class DeviceScope {
 public:
  // For noexcept callers: `ok()` says whether the device is current.
  DeviceScope(const detail::CudaApi& api, int device, std::nothrow_t) noexcept : api_(api) {
    if (bound_device == device) return;
    failed_call_ = "cudaGetDevice";
    status_ = api_.get_device(&previous_);
    if (status_ != detail::kCudaSuccess || previous_ == device) return;
    failed_call_ = "cudaSetDevice";
    status_ = api_.set_device(device);
    changed_ = status_ == detail::kCudaSuccess;
  }
  // Throws Error when the device cannot be made current.
  DeviceScope(const detail::CudaApi& api, int device) : DeviceScope(api, device, std::nothrow) {
    check(api_, status_, failed_call_);
  }
  ~DeviceScope() {
    if (changed_) api_.set_device(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  bool ok() const noexcept { return status_ == detail::kCudaSuccess; }

 private:
  const detail::CudaApi& api_;
  detail::CudaError status_ = detail::kCudaSuccess;
  const char* failed_call_ = "";
  int previous_ = 0;
  bool changed_ = false;
};

}  // namespace

std::shared_ptr<CudaRuntime> CudaRuntime::load(int device_index) {
  const detail::CudaApi& api = detail::api();
  if (api.library == nullptr) {
    throw Error("device='cuda' needs the CUDA runtime: " + api.load_error +
                    "; this machine has no NVIDIA GPU driver or no CUDA build of torch",
                ErrorKind::kGeneric);
  }
  int count = 0;
  const detail::CudaError status = api.get_device_count(&count);
  if (status != detail::kCudaSuccess) {
    throw Error(
        "device='cuda' needs the CUDA runtime and a usable GPU: libcudart is here, but "
        "cudaGetDeviceCount failed: " +
            std::string(api.get_error_string(status)) + " (cudaError " + std::to_string(status) +
            "); no NVIDIA GPU driver works on this machine",
        ErrorKind::kGeneric);
  }
  if (device_index < 0 || device_index >= count) {
    throw Error("device='cuda:" + std::to_string(device_index) + "' does not exist: CUDA sees " +
                    std::to_string(count) + " device(s)",
                ErrorKind::kInvalidArgument);
  }
  return std::shared_ptr<CudaRuntime>(new CudaRuntime(&api, device_index));
}

int CudaRuntime::device_count() noexcept {
  const detail::CudaApi& api = detail::api();
  if (api.library == nullptr) return 0;
  int count = 0;
  return api.get_device_count(&count) == detail::kCudaSuccess ? count : 0;
}

void CudaRuntime::bind_thread() {
  check(*api_, api_->set_device(device_index_), "cudaSetDevice");
  bound_device = device_index_;
}

void CudaRuntime::register_host(std::byte* data, size_t bytes) {
  const DeviceScope scope(*api_, device_index_);
  check(*api_, api_->host_register(data, bytes, detail::kCudaHostRegisterPortable),
        "cudaHostRegister");
}

void CudaRuntime::unregister_host(std::byte* data) noexcept {
  // Errors are ignored: this runs as memory is freed, possibly after the CUDA
  // context is gone at process exit (the registration then went with it).
  const DeviceScope scope(*api_, device_index_, std::nothrow);
  if (scope.ok()) api_->host_unregister(data);
}

std::byte* CudaRuntime::allocate(size_t bytes) {
  const DeviceScope scope(*api_, device_index_);
  void* data = nullptr;
  const detail::CudaError status = api_->malloc(&data, bytes);
  if (status != detail::kCudaSuccess) {
    throw OutOfMemory("CUDA: cudaMalloc of " + std::to_string(bytes) + " bytes on " + name() +
                      " failed: " + api_->get_error_string(status));
  }
  return static_cast<std::byte*>(data);
}

void CudaRuntime::free(std::byte* data) noexcept {
  const DeviceScope scope(*api_, device_index_, std::nothrow);
  if (scope.ok()) api_->free(data);
}

DeviceRuntime::Stream CudaRuntime::create_stream() {
  const DeviceScope scope(*api_, device_index_);
  detail::CudaStream stream = nullptr;
  check(*api_, api_->stream_create_with_flags(&stream, detail::kCudaStreamNonBlocking),
        "cudaStreamCreateWithFlags");
  return reinterpret_cast<Stream>(stream);
}

void CudaRuntime::destroy_stream(Stream stream) noexcept {
  if (stream != 0) api_->stream_destroy(reinterpret_cast<detail::CudaStream>(stream));
}

DeviceRuntime::Event CudaRuntime::create_event() {
  const DeviceScope scope(*api_, device_index_);
  detail::CudaEvent event = nullptr;
  // Blocking: a thread that waits for the event sleeps instead of spinning
  // a core for a whole GPU step.
  check(*api_,
        api_->event_create_with_flags(
            &event, detail::kCudaEventBlockingSync | detail::kCudaEventDisableTiming),
        "cudaEventCreateWithFlags");
  return reinterpret_cast<Event>(event);
}

void CudaRuntime::destroy_event(Event event) noexcept {
  if (event != 0) api_->event_destroy(reinterpret_cast<detail::CudaEvent>(event));
}

void CudaRuntime::copy_to_device(std::byte* device, const std::byte* host, size_t bytes,
                                 Stream stream) {
  const DeviceScope scope(*api_, device_index_);
  check(*api_,
        api_->memcpy_async(device, host, bytes, detail::kCudaMemcpyHostToDevice,
                           reinterpret_cast<detail::CudaStream>(stream)),
        "cudaMemcpyAsync");
}

void CudaRuntime::record(Event event, Stream stream) {
  const DeviceScope scope(*api_, device_index_);
  check(*api_,
        api_->event_record(reinterpret_cast<detail::CudaEvent>(event),
                           reinterpret_cast<detail::CudaStream>(stream)),
        "cudaEventRecord");
}

void CudaRuntime::wait(Stream stream, Event event) {
  const DeviceScope scope(*api_, device_index_);
  check(*api_,
        api_->stream_wait_event(reinterpret_cast<detail::CudaStream>(stream),
                                reinterpret_cast<detail::CudaEvent>(event), 0),
        "cudaStreamWaitEvent");
}

bool CudaRuntime::done(Event event) {
  const DeviceScope scope(*api_, device_index_);
  const detail::CudaError status = api_->event_query(reinterpret_cast<detail::CudaEvent>(event));
  if (status == detail::kCudaErrorNotReady) return false;
  check(*api_, status, "cudaEventQuery");
  return true;
}

void CudaRuntime::synchronize(Event event) {
  // (The device is made current so that a waiting thread's first CUDA call
  // does not create a context on device 0.)
  const DeviceScope scope(*api_, device_index_);
  check(*api_, api_->event_synchronize(reinterpret_cast<detail::CudaEvent>(event)),
        "cudaEventSynchronize");
}

}  // namespace leanloader
