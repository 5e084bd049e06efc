#include "leanloader/core/tensor.h"

#include <array>
#include <cstring>
#include <limits>
#include <span>
#include <vector>

#include "leanloader/core/checked_size.h"
#include "leanloader/core/error.h"

namespace leanloader {

size_t shape_numel(const Shape& shape) {
  size_t numel = 1;
  for (const int64_t dim : shape) {
    if (dim < 0) throw InvalidArgument("negative dimension in shape " + shape_to_string(shape));
    const auto d = static_cast<size_t>(dim);
    if (d != 0 && numel > std::numeric_limits<size_t>::max() / d) {
      throw InvalidArgument("shape " + shape_to_string(shape) + " overflows the address space");
    }
    numel *= d;
  }
  return numel;
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t stride = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = stride;
    // A 0 dimension counts as 1 (as numpy): an empty tensor's strides stay
    // distinct, and the product of the other dimensions must still fit.
    if (__builtin_mul_overflow(stride, shape[i] == 0 ? 1 : shape[i], &stride)) {
      throw InvalidArgument("shape " + shape_to_string(shape) + " overflows the address space");
    }
  }
  return strides;
}

std::string shape_to_string(const Shape& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

Tensor::Tensor(std::shared_ptr<Storage> storage, size_t byte_offset, DType dtype, Shape shape)
    : Tensor(std::move(storage), byte_offset, dtype, shape, contiguous_strides(shape)) {}

Tensor::Tensor(std::shared_ptr<Storage> storage, size_t byte_offset, DType dtype, Shape shape,
               Shape strides)
    : storage_(std::move(storage)),
      byte_offset_(byte_offset),
      dtype_(dtype),
      shape_(std::move(shape)),
      strides_(std::move(strides)),
      numel_(shape_numel(shape_)) {
  if (storage_ == nullptr) throw InvalidArgument("a Tensor needs a storage");
  if (strides_.size() != shape_.size()) {
    throw InvalidArgument("strides " + shape_to_string(strides_) + " do not match shape " +
                          shape_to_string(shape_));
  }
  if (dtype_is_subbyte(dtype_)) {
    // Packed elements have no byte address of their own: only dense views
    // whose bits end on a byte boundary exist.
    if (!is_contiguous()) {
      throw InvalidArgument("a " + std::string(dtype_name(dtype_)) + " tensor " +
                            shape_to_string(shape_) + " must be contiguous, got strides " +
                            shape_to_string(strides_));
    }
    if (!checked_nbytes_for(numel_, dtype_)) {
      throw InvalidArgument("a " + std::string(dtype_name(dtype_)) + " tensor " +
                            shape_to_string(shape_) + ": " + kSubbyteMisalignedMessage);
    }
  }
  // nbytes() relies on this: numel x itemsize fits in size_t.
  if (!checked_nbytes_for(numel_, dtype_)) {
    throw InvalidArgument("a " + std::string(dtype_name(dtype_)) + " tensor " +
                          shape_to_string(shape_) + " has more bytes than the address space");
  }
  check_bounds();
}

void Tensor::check_bounds() const {
  if (numel_ == 0) {
    if (byte_offset_ > storage_->size()) throw InvalidArgument("tensor offset past its storage");
    return;
  }
  // The furthest element a view can touch is sum((dim-1) * stride); every
  // step is checked, since shapes and strides may come from a file.
  std::optional<size_t> last = 0;
  for (size_t i = 0; i < shape_.size() && last; ++i) {
    if (strides_[i] < 0) throw InvalidArgument("negative strides are not supported");
    const auto reach =
        checked_mul(static_cast<size_t>(shape_[i] - 1), static_cast<size_t>(strides_[i]));
    last = reach ? checked_add(*last, *reach) : std::nullopt;
  }
  std::optional<size_t> extent;
  if (dtype_is_subbyte(dtype_)) {
    extent = nbytes();
  } else if (last) {
    const auto elements = checked_add(*last, 1);
    extent = elements ? checked_mul(*elements, dtype_size(dtype_)) : std::nullopt;
  }
  if (!extent || !range_fits(byte_offset_, *extent, storage_->size())) {
    throw InvalidArgument(
        "tensor view " + shape_to_string(shape_) + " of " + std::string(dtype_name(dtype_)) +
        " with strides " + shape_to_string(strides_) + " at offset " +
        std::to_string(byte_offset_) +
        (extent ? " ends at byte " + std::to_string(byte_offset_) + " + " + std::to_string(*extent)
                : std::string(" reaches past the address space")) +
        ", past its storage of " + std::to_string(storage_->size()) + " bytes");
  }
}

bool Tensor::is_contiguous() const noexcept {
  int64_t expected = 1;
  for (size_t i = shape_.size(); i-- > 0;) {
    if (shape_[i] != 1 && strides_[i] != expected) return false;
    expected *= shape_[i];
  }
  return true;
}

void Tensor::copy_to(std::byte* dst) const {
  if (is_contiguous()) {
    std::memcpy(dst, data(), nbytes());
  } else {
    copy_strided(data(), shape_, strides_, dtype_size(dtype_), dst);
  }
}

namespace {

// Copies dimension `dim` onwards; the innermost contiguous run uses memcpy.
std::byte* copy_dim(const std::byte* src, std::span<const int64_t> shape,
                    std::span<const int64_t> strides, size_t itemsize, size_t dim, std::byte* dst) {
  if (dim + 1 == shape.size() && strides[dim] == 1) {
    const size_t bytes = static_cast<size_t>(shape[dim]) * itemsize;
    std::memcpy(dst, src, bytes);
    return dst + bytes;
  }
  const size_t step = static_cast<size_t>(strides[dim]) * itemsize;
  for (int64_t i = 0; i < shape[dim]; ++i) {
    if (dim + 1 == shape.size()) {
      std::memcpy(dst, src + static_cast<size_t>(i) * step, itemsize);
      dst += itemsize;
    } else {
      dst = copy_dim(src + static_cast<size_t>(i) * step, shape, strides, itemsize, dim + 1, dst);
    }
  }
  return dst;
}

}  // namespace

void copy_strided(const std::byte* src, const Shape& shape, const Shape& strides, size_t itemsize,
                  std::byte* dst) {
  if (shape_numel(shape) == 0) return;
  // Merge each dimension into its inner neighbour when the two are laid out
  // contiguously, so that a contiguous block becomes one memcpy and a strided
  // view copies runs as long as its layout allows. Sources call this per
  // sample: the merged layout lives on the stack up to 16 dimensions.
  constexpr size_t kInlineDims = 16;
  std::array<int64_t, kInlineDims> inline_shape{};
  std::array<int64_t, kInlineDims> inline_strides{};
  std::vector<int64_t> heap_shape;
  std::vector<int64_t> heap_strides;
  int64_t* merged_shape = inline_shape.data();
  int64_t* merged_strides = inline_strides.data();
  if (shape.size() > kInlineDims) {
    heap_shape.resize(shape.size());
    heap_strides.resize(shape.size());
    merged_shape = heap_shape.data();
    merged_strides = heap_strides.data();
  }
  size_t dims = 0;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 1) continue;
    if (dims > 0 && merged_strides[dims - 1] == strides[i] * shape[i]) {
      merged_shape[dims - 1] *= shape[i];
      merged_strides[dims - 1] = strides[i];
    } else {
      merged_shape[dims] = shape[i];
      merged_strides[dims] = strides[i];
      ++dims;
    }
  }
  if (dims == 0 || (dims == 1 && merged_strides[0] == 1)) {
    std::memcpy(dst, src, shape_numel(shape) * itemsize);
    return;
  }
  copy_dim(src, {merged_shape, dims}, {merged_strides, dims}, itemsize, 0, dst);
}

}  // namespace leanloader
