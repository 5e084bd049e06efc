#include "memory/memory_nvml.h"

#include <dlfcn.h>

#include <mutex>
#include <vector>

#include "memory/nvml_process.h"

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
  // Optional (per-process figures): the _v2 entry points and their 24-byte
  // records, else the unversioned ones and 16-byte records (nvml_process.h).
  using RunningProcesses = NvmlReturn (*)(NvmlDevice, unsigned*, void*);
  RunningProcesses compute_processes = nullptr;
  RunningProcesses graphics_processes = nullptr;
  size_t process_record_bytes = 0;
  bool loaded = false;
};

constexpr NvmlReturn kNvmlInsufficientSize = 7;  // NVML_ERROR_INSUFFICIENT_SIZE

// Adds one of a device's process lists to `out`; a list that cannot be read
// is left out (the device's own figures still stand).
void add_processes(NvmlApi::RunningProcesses list, NvmlDevice device, size_t stride,
                   GpuProcessBytes& out) {
  if (list == nullptr) return;
  unsigned count = 0;
  NvmlReturn status = list(device, &count, nullptr);
  std::vector<std::byte> records;
  for (int attempt = 0; attempt < 3 && status == kNvmlInsufficientSize; ++attempt) {
    const std::optional<size_t> capacity = nvml_grow_capacity(count, stride);
    if (!capacity) return;
    records.assign(*capacity * stride, std::byte{0});
    count = static_cast<unsigned>(*capacity);
    status = list(device, &count, records.data());
  }
  if (status != kNvmlSuccess) return;
  parse_nvml_processes(records, count, stride, out);
}

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
    if (load_symbol(library, "nvmlDeviceGetComputeRunningProcesses_v2", api.compute_processes)) {
      load_symbol(library, "nvmlDeviceGetGraphicsRunningProcesses_v2", api.graphics_processes);
      api.process_record_bytes = kNvmlProcessInfoV2Bytes;
    } else if (load_symbol(library, "nvmlDeviceGetComputeRunningProcesses",
                           api.compute_processes)) {
      load_symbol(library, "nvmlDeviceGetGraphicsRunningProcesses", api.graphics_processes);
      api.process_record_bytes = kNvmlProcessInfoV1Bytes;
    }
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
      add_processes(api.compute_processes, device, api.process_record_bytes, gpu.process_bytes);
      add_processes(api.graphics_processes, device, api.process_record_bytes, gpu.process_bytes);
      gpus.push_back(std::move(gpu));
    }
  }
  api.shutdown();
  return gpus;
}

}  // namespace leanloader::detail
