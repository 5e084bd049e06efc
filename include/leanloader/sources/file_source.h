// FileSource: each sample is the raw bytes of one file (variable length), in
// a single U8 field "data" of shape [file size]. Batches of it are lists
// (collate="list"), since lengths differ.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "leanloader/sources/source.h"

namespace leanloader {

class FileSource final : public Source {
 public:
  // `paths` in sample order. Throws InvalidArgument when empty. Files are
  // opened only when read, so a missing file is an error of its sample.
  explicit FileSource(std::vector<std::string> paths);

  int64_t size() const override { return static_cast<int64_t>(paths_.size()); }
  const std::vector<FieldSpec>& fields() const override { return specs_; }
  void read_sample(int64_t index, SampleWriter& writer) const override;
  std::string describe() const override;
  std::string sample_location(int64_t index) const override {
    return paths_[static_cast<size_t>(index)];
  }
  size_t estimated_sample_bytes() const override { return estimated_bytes_; }
  const std::vector<std::string>& paths() const noexcept { return paths_; }

 private:
  std::vector<std::string> paths_;
  std::vector<FieldSpec> specs_;
  size_t estimated_bytes_ = 0;
};

}  // namespace leanloader
