// ImageSource: image files (JPEG/PNG/WebP, told by their bytes) decoded and
// transformed by the loader's threads, with optional integer labels.
//
// Fields: "image" (the transform's output: uint8 or float, CHW or HWC; fixed
// shape when the transform ends in a fixed size, varying otherwise, which
// needs collate="list") and, with labels, "label" (int64, shape []).
// Random transforms draw from Philox keyed by (seed, epoch, sample index)
// taken from SampleWriter::context() (see sources/source.h): the same sample
// gets the same crop and flip whatever the thread count.
// Errors: reading the file fails with stage "read", a bad image with stage
// "decode" (FormatError with the decoder's cause), each naming the file and
// the sample.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "leanloader/image/image_decoder.h"
#include "leanloader/image/image_transform.h"
#include "leanloader/sources/source.h"

namespace leanloader {

struct ImageSourceOptions {
  DecodeOptions decode;
  std::vector<TransformStep> transforms;
  ImageOutput output;
  // Decode JPEGs at a reduced DCT scale when a resize follows (faster; the
  // pixels then differ slightly from a full-size decode resized).
  bool dct_scaling = true;
};

class ImageSource final : public Source {
 public:
  // `paths` in sample order; `labels` empty or one per path. Throws
  // InvalidArgument for no paths, a label count that differs, or a bad
  // transform. Files are opened only when read.
  ImageSource(std::vector<std::string> paths, std::vector<int64_t> labels,
              ImageSourceOptions options);

  int64_t size() const override { return static_cast<int64_t>(paths_.size()); }
  const std::vector<FieldSpec>& fields() const override { return specs_; }
  void read_sample(int64_t index, SampleWriter& writer) const override;
  std::string describe() const override;
  std::string sample_location(int64_t index) const override;
  size_t estimated_sample_bytes() const override { return estimated_bytes_; }
  // What one reading thread holds while it decodes, from the headers probed
  // at construction: the largest of their file bytes plus decoded pixels
  // (a JPEG's at the DCT scale its first resize allows, a whole image
  // otherwise, twice when EXIF orientation turns it) plus a resize's
  // transposed copy of its input and pass rows plus the output.
  size_t per_thread_scratch_bytes() const override { return scratch_bytes_; }

  // The parameters sample `index` gets in (seed, epoch): reads the file's
  // header only. Errors as read_sample's.
  TransformParams sample_params(int64_t index, uint64_t seed, uint64_t epoch) const;

  const std::vector<std::string>& paths() const noexcept { return paths_; }
  const std::vector<int64_t>& labels() const noexcept { return labels_; }
  const ImageTransform& transform() const noexcept { return transform_; }

 private:
  void check_index(int64_t index) const;
  size_t decode_scratch_bytes(size_t file_size, const ImageInfo& info,
                              const TransformParams& params) const;

  std::vector<std::string> paths_;
  std::vector<int64_t> labels_;
  ImageSourceOptions options_;
  ImageTransform transform_;
  std::vector<FieldSpec> specs_;
  size_t estimated_bytes_ = 0;
  size_t scratch_bytes_ = 0;
};

}  // namespace leanloader
