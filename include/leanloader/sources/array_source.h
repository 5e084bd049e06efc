// ArraySource: samples are rows of in-memory arrays (the user's NumPy arrays,
// viewed, never copied). Row i of every field is sample i.
#pragma once

#include <string>
#include <vector>

#include "leanloader/core/tensor.h"
#include "leanloader/sources/source.h"

namespace leanloader {

class ArraySource final : public Source {
 public:
  struct Field {
    std::string name;
    Tensor array;  // rows along dimension 0; any non-negative strides
  };

  // Throws InvalidArgument when there are no fields, a field is rank 0, or the
  // fields disagree on the number of rows.
  explicit ArraySource(std::vector<Field> fields);

  int64_t size() const override { return rows_; }
  const std::vector<FieldSpec>& fields() const override { return specs_; }
  void read_sample(int64_t index, SampleWriter& writer) const override;
  std::string describe() const override;
  std::string sample_location(int64_t index) const override;
  size_t estimated_sample_bytes() const override { return row_bytes_; }
  void will_read(int64_t index) const noexcept override;

 private:
  // How one field's rows are laid out, worked out once at construction (not
  // per sample).
  struct RowLayout {
    Shape strides;            // elements, dimensions after the first
    size_t row_step = 0;      // bytes between rows
    size_t row_bytes = 0;     // bytes of a row in its batch
    bool contiguous = false;  // a row is row_bytes consecutive bytes
  };

  std::vector<Field> arrays_;
  std::vector<RowLayout> layouts_;
  std::vector<FieldSpec> specs_;
  int64_t rows_ = 0;
  size_t row_bytes_ = 0;
};

}  // namespace leanloader
