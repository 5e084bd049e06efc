// Per-process GPU memory from NVML's nvmlDeviceGet{Compute,Graphics}
// RunningProcesses answers, parsed without NVML (testable here, where the
// library is absent). Layouts (nvml.h, x86-64/aarch64 alignment):
//   nvmlProcessInfo_v1_t {unsigned int pid; unsigned long long usedGpuMemory;}
//     -> 16 bytes (pid at 0, 4 bytes padding, usedGpuMemory at 8)
//   nvmlProcessInfo_v2_t {pid; usedGpuMemory; unsigned int gpuInstanceId;
//     unsigned int computeInstanceId;} -> 24 bytes (the _v2 entry point).
//   The _v3 entry point takes nvmlProcessInfo_t, and public headers disagree
//   on it: some nvml.h (CUDA 12.0 era) and pynvml's c_nvmlProcessInfo_v3_t
//   append `unsigned long long usedGpuCcProtectedMemory` (32 bytes); other
//   nvml.h versions make nvmlProcessInfo_t the 24-byte v2 layout and put that
//   field in nvmlProcessDetail_v1_t (nvmlDeviceGetRunningProcessDetailList).
// Every layout has pid at offset 0 and usedGpuMemory at offset 8, so the
// parser takes the record stride of the entry point that answered.
// OPEN (needs a GPU machine): which stride a given driver's _v3 writes; until
// checked, the caller should prefer _v2 (24 bytes, unambiguous), then the
// unversioned entry point (16 bytes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <span>

#include "leanloader/core/checked_size.h"

namespace leanloader::detail {

inline constexpr unsigned long long kNvmlValueNotAvailable = ~0ULL;
inline constexpr size_t kNvmlProcessInfoV1Bytes = 16;
inline constexpr size_t kNvmlProcessInfoV2Bytes = 24;

// pid -> bytes; std::nullopt bytes when NVML reported NVML_VALUE_NOT_AVAILABLE
// for any record of that pid (a pid may appear once per context / list).
using GpuProcessBytes = std::map<uint32_t, std::optional<uint64_t>>;

// Adds `count` records of `stride` bytes from `raw` into `out` (compute and
// graphics lists of one device are merged by taking the larger figure: the
// same context is listed in both). Returns false when the buffer is too short
// for `count` records or the stride is below 16.
inline bool parse_nvml_processes(std::span<const std::byte> raw, size_t count, size_t stride,
                                 GpuProcessBytes& out) noexcept {
  if (stride < kNvmlProcessInfoV1Bytes) return false;
  auto need = checked_mul(count, stride);
  if (!need || *need > raw.size()) return false;
  for (size_t i = 0; i < count; ++i) {
    const std::byte* rec = raw.data() + i * stride;
    uint32_t pid = 0;
    unsigned long long used = 0;
    std::memcpy(&pid, rec, sizeof pid);
    std::memcpy(&used, rec + 8, sizeof used);
    std::optional<uint64_t> bytes;
    if (used != kNvmlValueNotAvailable) bytes = static_cast<uint64_t>(used);
    auto [it, inserted] = out.emplace(pid, bytes);
    if (inserted) continue;
    if (!it->second || !bytes) {
      it->second = std::nullopt;
    } else if (*bytes > *it->second) {
      it->second = bytes;
    }
  }
  return true;
}

// Capacity for the next call after NVML_ERROR_INSUFFICIENT_SIZE reported
// `wanted` records: wanted + 8 headroom (processes come and go between calls),
// nullopt past `limit` records or when the bytes overflow.
inline std::optional<size_t> nvml_grow_capacity(size_t wanted, size_t stride,
                                                size_t limit = 4096) noexcept {
  auto cap = checked_add(wanted, 8);
  if (!cap || *cap > limit || !checked_mul(*cap, stride)) return std::nullopt;
  return cap;
}

}  // namespace leanloader::detail
