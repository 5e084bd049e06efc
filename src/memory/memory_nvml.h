// NVML (the NVIDIA driver's management library), loaded at run time.
//
// leanloader links no GPU library: libnvidia-ml.so.1 ships with the driver,
// so it is opened with dlopen on first use and a machine without the driver
// simply has no GPUs to report.
#pragma once

#include <optional>
#include <vector>

#include "leanloader/memory/memory_monitor.h"

namespace leanloader::detail {

// Every GPU NVML sees, or nullopt when the library is missing or nvmlInit
// fails (no driver, no device). Thread-safe (NVML is; the library handle is
// opened once and never closed, since NVML may keep threads of its own).
std::optional<std::vector<GpuMemory>> query_nvml_gpus();

}  // namespace leanloader::detail
