// Checked arithmetic for sizes computed from untrusted numbers: shapes read
// from file headers, batch sizes, offsets. Every byte count the engine derives
// from such numbers goes through these; the caller turns nullopt into an
// error that names the file and the rule (FormatError for bytes on disk,
// InvalidArgument for a bad call).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "leanloader/core/dtype.h"

namespace leanloader {

// a * b, or nullopt when it does not fit in size_t.
constexpr std::optional<size_t> checked_mul(size_t a, size_t b) noexcept {
  size_t out = 0;
  if (__builtin_mul_overflow(a, b, &out)) return std::nullopt;
  return out;
}

// a + b, or nullopt when it does not fit in size_t.
constexpr std::optional<size_t> checked_add(size_t a, size_t b) noexcept {
  size_t out = 0;
  if (__builtin_add_overflow(a, b, &out)) return std::nullopt;
  return out;
}

// value rounded up to a multiple of `multiple` (> 0), or nullopt on overflow.
constexpr std::optional<size_t> checked_round_up(size_t value, size_t multiple) noexcept {
  const auto padded = checked_add(value, multiple - 1);
  if (!padded) return std::nullopt;
  return *padded / multiple * multiple;
}

// The number of elements of `shape`; nullopt for a negative dimension or
// when the product does not fit in size_t.
std::optional<size_t> checked_numel(std::span<const int64_t> shape) noexcept;

// The bits of a dense tensor of `shape` and `dtype` (numel x dtype_bits);
// nullopt when checked_numel fails or the product does not fit in size_t
// (the reference computes sizes in bits too, so this is its overflow rule).
std::optional<size_t> checked_nbits(std::span<const int64_t> shape, DType dtype) noexcept;

// The bytes of a dense tensor of `shape` and `dtype`; nullopt when
// checked_nbits fails, or when a sub-byte tensor's bits do not fill whole
// bytes (the reference's rule: numel x bits must be a multiple of 8, e.g. an
// F4 tensor needs an even element count; the error to give is
// kSubbyteMisalignedMessage).
std::optional<size_t> checked_nbytes(std::span<const int64_t> shape, DType dtype) noexcept;

// The same for an element count.
std::optional<size_t> checked_nbytes_for(size_t numel, DType dtype) noexcept;

// The reference safetensors 0.8's words (SafeTensorError::MisalignedSlice)
// for a sub-byte tensor whose bits do not end on a byte boundary.
inline constexpr const char* kSubbyteMisalignedMessage =
    "The slice is slicing for subbytes dtypes, and the slice does not end up at a byte boundary, "
    "this is invalid.";

// True when [offset, offset + length) lies inside [0, size) without overflow.
constexpr bool range_fits(size_t offset, size_t length, size_t size) noexcept {
  const auto end = checked_add(offset, length);
  return end.has_value() && *end <= size;
}

}  // namespace leanloader
