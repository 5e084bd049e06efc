// DeviceLocation: where the bytes of a Storage live (host memory, or the
// memory of one accelerator), as DLPack names it.
#pragma once

#include <cstdint>

namespace leanloader {

struct DeviceLocation {
  enum class Type : int32_t {
    kCpu = 1,   // DLPack kDLCPU
    kCuda = 2,  // DLPack kDLCUDA
  };
  Type type = Type::kCpu;
  int32_t index = 0;

  bool is_cpu() const noexcept { return type == Type::kCpu; }
  friend bool operator==(const DeviceLocation&, const DeviceLocation&) = default;
};

}  // namespace leanloader
