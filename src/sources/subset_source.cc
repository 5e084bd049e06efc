#include "leanloader/sources/subset_source.h"

#include "leanloader/core/error.h"

namespace leanloader {

SubsetSource::SubsetSource(std::shared_ptr<const Source> base, std::vector<int64_t> indices)
    : base_(std::move(base)), indices_(std::move(indices)) {
  if (base_ == nullptr) throw InvalidArgument("SubsetSource needs a base source");
  const int64_t n = base_->size();
  for (const int64_t index : indices_) {
    if (index < 0 || index >= n) {
      throw InvalidArgument("SubsetSource: index " + std::to_string(index) + " out of range for " +
                            base_->describe() + " (" + std::to_string(n) + " samples)");
    }
  }
}

int64_t SubsetSource::base_index(int64_t index) const {
  if (index < 0 || index >= size()) {
    throw InvalidArgument("index " + std::to_string(index) + " out of range for " +
                          std::to_string(size()) + " samples");
  }
  return indices_[static_cast<size_t>(index)];
}

void SubsetSource::read_sample(int64_t index, SampleWriter& writer) const {
  base_->read_sample(base_index(index), writer);
}

std::string SubsetSource::describe() const {
  return "SubsetSource(" + std::to_string(indices_.size()) + " of " + base_->describe() + ")";
}

std::string SubsetSource::sample_location(int64_t index) const {
  return base_->sample_location(base_index(index));
}

}  // namespace leanloader
