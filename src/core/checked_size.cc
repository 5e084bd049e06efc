#include "leanloader/core/checked_size.h"

namespace leanloader {

std::optional<size_t> checked_numel(std::span<const int64_t> shape) noexcept {
  size_t numel = 1;
  for (const int64_t dim : shape) {
    if (dim < 0) return std::nullopt;
    const auto product = checked_mul(numel, static_cast<size_t>(dim));
    if (!product) return std::nullopt;
    numel = *product;
  }
  return numel;
}

std::optional<size_t> checked_nbits(std::span<const int64_t> shape, DType dtype) noexcept {
  const auto numel = checked_numel(shape);
  if (!numel) return std::nullopt;
  return checked_mul(*numel, dtype_bits(dtype));
}

std::optional<size_t> checked_nbytes_for(size_t numel, DType dtype) noexcept {
  const auto bits = checked_mul(numel, dtype_bits(dtype));
  if (!bits || *bits % 8 != 0) return std::nullopt;
  return *bits / 8;
}

std::optional<size_t> checked_nbytes(std::span<const int64_t> shape, DType dtype) noexcept {
  const auto numel = checked_numel(shape);
  if (!numel) return std::nullopt;
  return checked_nbytes_for(*numel, dtype);
}

}  // namespace leanloader
