#include "leanloader/core/dtype.h"

#include <iterator>

namespace leanloader {

namespace {

// DLPack 1.1 type codes (dlpack.h, DLDataTypeCode).
enum : uint8_t {
  kDLInt = 0,
  kDLUInt = 1,
  kDLFloat = 2,
  kDLBfloat = 4,
  kDLComplex = 5,
  kDLBool = 6,
  kDLFloat8E4M3Fn = 10,
  kDLFloat8E4M3Fnuz = 11,
  kDLFloat8E5M2 = 12,
  kDLFloat8E5M2Fnuz = 13,
  kDLFloat8E8M0Fnu = 14,
  kDLFloat6E2M3Fn = 15,
  kDLFloat6E3M2Fn = 16,
  kDLFloat4E2M1Fn = 17,
};

struct DTypeInfo {
  DType dtype;
  std::string_view name;
  uint8_t bits;
  DLPackType dlpack;
};

constexpr DTypeInfo kInfo[] = {
    {DType::kBool, "BOOL", 8, {kDLBool, 8}},
    {DType::kU8, "U8", 8, {kDLUInt, 8}},
    {DType::kI8, "I8", 8, {kDLInt, 8}},
    {DType::kU16, "U16", 16, {kDLUInt, 16}},
    {DType::kI16, "I16", 16, {kDLInt, 16}},
    {DType::kU32, "U32", 32, {kDLUInt, 32}},
    {DType::kI32, "I32", 32, {kDLInt, 32}},
    {DType::kU64, "U64", 64, {kDLUInt, 64}},
    {DType::kI64, "I64", 64, {kDLInt, 64}},
    {DType::kF16, "F16", 16, {kDLFloat, 16}},
    {DType::kBF16, "BF16", 16, {kDLBfloat, 16}},
    {DType::kF32, "F32", 32, {kDLFloat, 32}},
    {DType::kF64, "F64", 64, {kDLFloat, 64}},
    {DType::kC64, "C64", 64, {kDLComplex, 64}},
    {DType::kF8E4M3, "F8_E4M3", 8, {kDLFloat8E4M3Fn, 8}},
    {DType::kF8E5M2, "F8_E5M2", 8, {kDLFloat8E5M2, 8}},
    {DType::kF8E4M3Fnuz, "F8_E4M3FNUZ", 8, {kDLFloat8E4M3Fnuz, 8}},
    {DType::kF8E5M2Fnuz, "F8_E5M2FNUZ", 8, {kDLFloat8E5M2Fnuz, 8}},
    {DType::kF8E8M0, "F8_E8M0", 8, {kDLFloat8E8M0Fnu, 8}},
    {DType::kF6E2M3, "F6_E2M3", 6, {kDLFloat6E2M3Fn, 6}},
    {DType::kF6E3M2, "F6_E3M2", 6, {kDLFloat6E3M2Fn, 6}},
    {DType::kF4, "F4", 4, {kDLFloat4E2M1Fn, 4}},
    {DType::kC128, "C128", 128, {kDLComplex, 128}},
};

static_assert(std::size(kInfo) == std::size(kAllDTypes));

const DTypeInfo& info(DType dtype) noexcept { return kInfo[static_cast<size_t>(dtype)]; }

}  // namespace

size_t dtype_bits(DType dtype) noexcept { return info(dtype).bits; }

size_t dtype_size(DType dtype) noexcept { return info(dtype).bits < 8 ? 1 : info(dtype).bits / 8; }

std::string_view dtype_name(DType dtype) noexcept { return info(dtype).name; }

std::optional<DType> dtype_from_name(std::string_view name) noexcept {
  for (const auto& entry : kInfo) {
    if (entry.name == name) return entry.dtype;
  }
  return std::nullopt;
}

DLPackType dlpack_type(DType dtype) noexcept { return info(dtype).dlpack; }

std::optional<DType> dtype_from_dlpack(DLPackType type) noexcept {
  for (const auto& entry : kInfo) {
    if (entry.dlpack.code == type.code && entry.dlpack.bits == type.bits) return entry.dtype;
  }
  return std::nullopt;
}

}  // namespace leanloader
