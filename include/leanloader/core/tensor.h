// Tensor: a typed, shaped, strided view over bytes owned by a Storage.
//
// A Tensor never owns bytes itself; copying a Tensor copies the view and
// shares the Storage. Strides are in elements (the DLPack convention).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "leanloader/core/dtype.h"
#include "leanloader/core/storage.h"

namespace leanloader {

using Shape = std::vector<int64_t>;

// Product of dims; throws InvalidArgument on a negative dim or overflow.
size_t shape_numel(const Shape& shape);
// Row-major (C order) strides in elements; throws InvalidArgument when the
// product of the non-zero dims overflows.
Shape contiguous_strides(const Shape& shape);
// "[16, 128, 128]"
std::string shape_to_string(const Shape& shape);

class Tensor {
 public:
  Tensor() = default;
  // A contiguous view at `byte_offset` into `storage`. Throws InvalidArgument
  // when the view does not fit inside the storage.
  Tensor(std::shared_ptr<Storage> storage, size_t byte_offset, DType dtype, Shape shape);
  // A strided view; `strides` in elements, non-negative. A sub-byte dtype
  // (F4, F6_*) needs contiguous strides and an element count that fills
  // whole bytes (InvalidArgument otherwise).
  Tensor(std::shared_ptr<Storage> storage, size_t byte_offset, DType dtype, Shape shape,
         Shape strides);

  const std::shared_ptr<Storage>& storage() const noexcept { return storage_; }
  size_t byte_offset() const noexcept { return byte_offset_; }
  DType dtype() const noexcept { return dtype_; }
  const Shape& shape() const noexcept { return shape_; }
  const Shape& strides() const noexcept { return strides_; }
  size_t ndim() const noexcept { return shape_.size(); }
  size_t numel() const noexcept { return numel_; }
  // numel x bits / 8 (whole bytes: a sub-byte tensor is only made when its
  // elements fill whole bytes).
  size_t nbytes() const noexcept {
    return dtype_is_subbyte(dtype_) ? numel_ * dtype_bits(dtype_) / 8 : numel_ * dtype_size(dtype_);
  }
  bool is_contiguous() const noexcept;

  std::byte* data() const noexcept { return storage_->data() + byte_offset_; }

  // Copies the elements in row-major order into `dst` (nbytes() bytes).
  void copy_to(std::byte* dst) const;

 private:
  void check_bounds() const;

  std::shared_ptr<Storage> storage_;
  size_t byte_offset_ = 0;
  DType dtype_ = DType::kU8;
  Shape shape_;
  Shape strides_;
  size_t numel_ = 0;
};

// Copies an element array with arbitrary strides (elements) into dense
// row-major order at `dst`.
void copy_strided(const std::byte* src, const Shape& shape, const Shape& strides, size_t itemsize,
                  std::byte* dst);

}  // namespace leanloader
