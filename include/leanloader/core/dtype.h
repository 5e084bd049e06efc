// Element types of tensors: every dtype the reference safetensors 0.8 reads
// and writes, the sub-byte ones (F4, F6_E2M3, F6_E3M2) included, and
// complex128 (numpy's default complex; .npy, HDF5 and arrays hold it), which
// safetensors has no dtype for: its files refuse it (dtype_in_safetensors).
//
// The safetensors name ("F16", "BF16", ...) is the canonical spelling used in
// files and messages; DLPack codes follow DLPack 1.1 (float8, float6 and
// float4 codes included).
//
// Sub-byte dtypes are packed: a tensor of n elements takes n x bits / 8
// bytes, which must be whole (the reference's rule; see checked_nbytes). Such
// tensors are always dense: a view starts and ends on a byte boundary.
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
  kF6E2M3,  // 6 bits, packed
  kF6E3M2,  // 6 bits, packed
  kF4,      // float4 e2m1, 4 bits, packed (torch.float4_e2m1fn_x2 holds two)
  kC128,    // complex128: not a safetensors dtype
};

inline constexpr DType kAllDTypes[] = {
    DType::kBool,   DType::kU8,         DType::kI8,         DType::kU16,    DType::kI16,
    DType::kU32,    DType::kI32,        DType::kU64,        DType::kI64,    DType::kF16,
    DType::kBF16,   DType::kF32,        DType::kF64,        DType::kC64,    DType::kF8E4M3,
    DType::kF8E5M2, DType::kF8E4M3Fnuz, DType::kF8E5M2Fnuz, DType::kF8E8M0, DType::kF6E2M3,
    DType::kF6E3M2, DType::kF4,         DType::kC128,
};

// Bits per element (the reference's bitsize): 4 for F4, 6 for F6_*, 8 for
// BOOL, 64 for C64.
size_t dtype_bits(DType dtype) noexcept;

// True for the packed dtypes whose elements are narrower than a byte.
inline bool dtype_is_subbyte(DType dtype) noexcept { return dtype_bits(dtype) < 8; }

// Bytes per element of a byte-sized dtype. A sub-byte dtype has no whole
// bytes per element: its storage unit, 1, is returned; compute byte counts
// of such tensors with checked_nbytes (core/checked_size.h), never with this.
size_t dtype_size(DType dtype) noexcept;

// The safetensors spelling, e.g. "BF16" ("C128" for complex128, which
// safetensors lacks).
std::string_view dtype_name(DType dtype) noexcept;

// Parses a spelling of dtype_name; nullopt for anything else.
std::optional<DType> dtype_from_name(std::string_view name) noexcept;

// True for the dtypes safetensors files may hold (all but complex128).
inline bool dtype_in_safetensors(DType dtype) noexcept { return dtype != DType::kC128; }

// DLPack (code, bits) for export, one element per lane (lanes = 1). DLPack
// 1.1 has codes for the sub-byte dtypes too (15, 16, 17 with 6 or 4 bits);
// torch reads float4 as (17, 4 bits, 2 lanes) = torch.float4_e2m1fn_x2.
struct DLPackType {
  uint8_t code;
  uint8_t bits;
};
DLPackType dlpack_type(DType dtype) noexcept;
std::optional<DType> dtype_from_dlpack(DLPackType type) noexcept;

}  // namespace leanloader
