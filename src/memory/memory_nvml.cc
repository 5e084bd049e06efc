#include "memory/memory_nvml.h"

#include <dlfcn.h>

#include <mutex>

namespace leanloader::detail {

namespace {

// The subset of nvml.h we call; the ABI of these entry points is stable
// (the _v2 names exist since driver 325).
using NvmlReturn = int;
using NvmlDevice = void*;
struct NvmlMemory {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
constexpr NvmlReturn kNvmlSuccess = 0;
constexpr NvmlReturn kNvmlNotSupported = 3;
constexpr unsigned kNvmlNameBufferSize = 96;  // NVML_DEVICE_NAME_V2_BUFFER_SIZE

struct NvmlApi {
  NvmlReturn (*init)() = nullptr;
  NvmlReturn (*shutdown)() = nullptr;
  NvmlReturn (*device_count)(unsigned*) = nullptr;
  NvmlReturn (*device_handle)(unsigned, NvmlDevice*) = nullptr;
  NvmlReturn (*device_name)(NvmlDevice, char*, unsigned) = nullptr;
  NvmlReturn (*device_memory)(NvmlDevice, NvmlMemory*) = nullptr;
  bool loaded = false;
};

template <typename Fn>
bool load_symbol(void* library, const char* name, Fn& out) {
  void* symbol = dlsym(library, name);
  if (symbol == nullptr) return false;
  out = reinterpret_cast<Fn>(symbol);
  return true;
}

const NvmlApi& nvml_api() {
  static NvmlApi api;
  static std::once_flag once;
  std::call_once(once, [] {
    void* library = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) return;
    api.loaded = load_symbol(library, "nvmlInit_v2", api.init) &&
                 load_symbol(library, "nvmlShutdown", api.shutdown) &&
                 load_symbol(library, "nvmlDeviceGetCount_v2", api.device_count) &&
                 load_symbol(library, "nvmlDeviceGetHandleByIndex_v2", api.device_handle) &&
                 load_symbol(library, "nvmlDeviceGetName", api.device_name) &&
                 load_symbol(library, "nvmlDeviceGetMemoryInfo", api.device_memory);
  });
  return api;
}

}  // namespace

std::optional<std::vector<GpuMemory>> query_nvml_gpus() {
  const NvmlApi& api = nvml_api();
  if (!api.loaded || api.init() != kNvmlSuccess) return std::nullopt;
  std::vector<GpuMemory> gpus;
  unsigned count = 0;
  if (api.device_count(&count) == kNvmlSuccess) {
    for (unsigned i = 0; i < count; ++i) {
      NvmlDevice device = nullptr;
      if (api.device_handle(i, &device) != kNvmlSuccess) continue;
      GpuMemory gpu;
      gpu.index = static_cast<int>(i);
      char name[kNvmlNameBufferSize] = {};
      if (api.device_name(device, name, kNvmlNameBufferSize) == kNvmlSuccess) gpu.name = name;
      NvmlMemory memory{};
      const NvmlReturn status = api.device_memory(device, &memory);
      if (status == kNvmlSuccess) {
        gpu.total_bytes = memory.total;
        gpu.free_bytes = memory.free;
        gpu.used_bytes = memory.used;
      } else if (status == kNvmlNotSupported) {
        // What unified-memory parts (GB10) answer: there is no separate VRAM.
        gpu.memory_info_supported = false;
      }  // any other error leaves the figures at 0
      gpus.push_back(std::move(gpu));
    }
  }
  api.shutdown();
  return gpus;
}

}  // namespace leanloader::detail
