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

std::optional<size_t> checked_nbytes(std::span<const int64_t> shape, DType dtype) noexcept {
  const auto numel = checked_numel(shape);
  if (!numel) return std::nullopt;
  return checked_mul(*numel, dtype_size(dtype));
}

}  // namespace leanloader
