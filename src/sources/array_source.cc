#include "leanloader/sources/array_source.h"

#include "io/streaming_copy.h"
#include "leanloader/core/error.h"

namespace leanloader {

ArraySource::ArraySource(std::vector<Field> fields) : arrays_(std::move(fields)) {
  if (arrays_.empty()) throw InvalidArgument("ArraySource needs at least one array");
  rows_ = -1;
  for (const Field& field : arrays_) {
    if (dtype_is_subbyte(field.array.dtype())) {
      // Rows are addressed by element strides, which packed elements lack.
      throw InvalidArgument("ArraySource field '" + field.name + "' is " +
                            std::string(dtype_name(field.array.dtype())) +
                            " (packed sub-byte elements); store it in a TensorCache or a "
                            ".safetensors file, or pass its bytes as uint8");
    }
    if (field.array.ndim() == 0) {
      throw InvalidArgument("ArraySource field '" + field.name +
                            "' is a scalar; samples are rows along the first dimension");
    }
    const int64_t rows = field.array.shape()[0];
    if (rows_ >= 0 && rows != rows_) {
      throw InvalidArgument("ArraySource fields disagree on the number of samples: '" +
                            arrays_.front().name + "' has " + std::to_string(rows_) + " rows, '" +
                            field.name + "' has " + std::to_string(rows));
    }
    rows_ = rows;
    Shape row_shape(field.array.shape().begin() + 1, field.array.shape().end());
    RowLayout layout;
    layout.strides.assign(field.array.strides().begin() + 1, field.array.strides().end());
    const size_t itemsize = dtype_size(field.array.dtype());
    layout.row_step = static_cast<size_t>(field.array.strides()[0]) * itemsize;
    layout.row_bytes = shape_numel(row_shape) * itemsize;
    layout.contiguous = layout.strides == contiguous_strides(row_shape);
    row_bytes_ += layout.row_bytes;
    layouts_.push_back(std::move(layout));
    specs_.push_back({field.name, field.array.dtype(), std::move(row_shape)});
  }
}

void ArraySource::read_sample(int64_t index, SampleWriter& writer) const {
  if (index < 0 || index >= rows_) {
    throw InvalidArgument("index " + std::to_string(index) + " out of range for " +
                          std::to_string(rows_) + " samples");
  }
  const detail::Stores stores =
      writer.prefers_streaming_stores() ? detail::Stores::kStreaming : detail::Stores::kCached;
  for (size_t f = 0; f < arrays_.size(); ++f) {
    const Tensor& array = arrays_[f].array;
    const RowLayout& layout = layouts_[f];
    const Shape& row_shape = *specs_[f].shape;
    const std::byte* row = array.data() + static_cast<size_t>(index) * layout.row_step;
    const std::span<std::byte> dst = writer.field_buffer(f, row_shape);
    if (layout.contiguous) {
      detail::copy_with(stores, dst.data(), row, layout.row_bytes);
    } else {
      copy_strided(row, row_shape, layout.strides, dtype_size(array.dtype()), dst.data());
    }
  }
}

void ArraySource::will_read(int64_t index) const noexcept {
  if (index < 0 || index >= rows_) return;
  for (size_t f = 0; f < arrays_.size(); ++f) {
    const RowLayout& layout = layouts_[f];
    if (!layout.contiguous) continue;
    detail::prefetch_for_copy(
        arrays_[f].array.data() + static_cast<size_t>(index) * layout.row_step, layout.row_bytes);
  }
}

std::string ArraySource::describe() const {
  std::string names;
  for (const Field& field : arrays_) names += (names.empty() ? "" : ", ") + field.name;
  return "ArraySource(" + names + ")";
}

std::string ArraySource::sample_location(int64_t index) const {
  return "row " + std::to_string(index);
}

}  // namespace leanloader
