// Element types of tensors: every byte-sized safetensors dtype.
//
// The safetensors name ("F16", "BF16", ...) is the canonical spelling used in
// files and messages; DLPack codes follow DLPack 1.1 (float8 codes included).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace leanloader {

enum class DType : uint8_t {
  kBool,
  kU8,
  kI8,
  kU16,
  kI16,
  kU32,
  kI32,
  kU64,
  kI64,
  kF16,
  kBF16,
  kF32,
  kF64,
  kC64,
  kF8E4M3,
  kF8E5M2,
  kF8E4M3Fnuz,
  kF8E5M2Fnuz,
  kF8E8M0,
};

inline constexpr DType kAllDTypes[] = {
    DType::kBool,   DType::kU8,         DType::kI8,         DType::kU16,    DType::kI16,
    DType::kU32,    DType::kI32,        DType::kU64,        DType::kI64,    DType::kF16,
    DType::kBF16,   DType::kF32,        DType::kF64,        DType::kC64,    DType::kF8E4M3,
    DType::kF8E5M2, DType::kF8E4M3Fnuz, DType::kF8E5M2Fnuz, DType::kF8E8M0,
};

// Bytes per element.
size_t dtype_size(DType dtype) noexcept;

// The safetensors spelling, e.g. "BF16".
std::string_view dtype_name(DType dtype) noexcept;

// Parses a safetensors spelling; nullopt for anything else.
std::optional<DType> dtype_from_name(std::string_view name) noexcept;

// DLPack (code, bits) for export; lanes are always 1.
struct DLPackType {
  uint8_t code;
  uint8_t bits;
};
DLPackType dlpack_type(DType dtype) noexcept;
std::optional<DType> dtype_from_dlpack(DLPackType type) noexcept;

}  // namespace leanloader
