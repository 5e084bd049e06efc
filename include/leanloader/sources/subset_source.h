// SubsetSource: some samples of another Source, in a given order.
//
// Sample i of the subset is sample indices[i] of the base. Used to feed a
// Loader only the samples a TensorCache build still has to (re)compute.
// Thread-safety and lifetime: immutable; keeps the base alive.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "leanloader/sources/source.h"

namespace leanloader {

class SubsetSource final : public Source {
 public:
  // Throws InvalidArgument for an index outside the base.
  SubsetSource(std::shared_ptr<const Source> base, std::vector<int64_t> indices);

  int64_t size() const override { return static_cast<int64_t>(indices_.size()); }
  const std::vector<FieldSpec>& fields() const override { return base_->fields(); }
  void read_sample(int64_t index, SampleWriter& writer) const override;
  std::string describe() const override;
  std::string sample_location(int64_t index) const override;
  size_t estimated_sample_bytes() const override { return base_->estimated_sample_bytes(); }

  const std::vector<int64_t>& indices() const noexcept { return indices_; }
  int64_t base_index(int64_t index) const;

 private:
  std::shared_ptr<const Source> base_;
  std::vector<int64_t> indices_;
};

}  // namespace leanloader
