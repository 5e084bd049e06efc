// ImageTransform: torchvision-style per-sample transforms (Resize,
// CenterCrop, RandomResizedCrop, RandomHorizontalFlip, Normalize) fused into
// one pass that writes the sample's output tensor.
//
// A transform is planned from the displayed image size and the sample's
// random draws (planning is pure arithmetic, no pixels): the geometric steps
// reduce to crops and resizes (a flip moves to the end, mirroring the crops
// after it), so the decoder is asked only for the first crop's region,
// shrunk by DCT scaling as far as the first resize allows. Resizing is
// OpenCV's: INTER_AREA when shrinking (antialiased), INTER_LINEAR when
// enlarging. Output: dtype uint8 (pixels as decoded), or float32 / float16 /
// bfloat16 as x / 255, normalized as (x / 255 - mean) / std when mean and
// std are given; layout CHW (torch's) or HWC.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "leanloader/core/dtype.h"
#include "leanloader/core/tensor.h"
#include "leanloader/image/image_decoder.h"
#include "leanloader/image/philox.h"

namespace leanloader {

namespace detail {
struct OutputTables;  // the output value of each (channel, byte), built once
}

struct TransformStep {
  enum class Kind { kResize, kCenterCrop, kRandomResizedCrop, kHorizontalFlip };
  Kind kind = Kind::kResize;
  // Resize: (height, width), or the shorter side when `width` is 0 (the
  // longer one scales, truncated as torchvision does), capped by max_size.
  // CenterCrop / RandomResizedCrop: the output (height, width). CenterCrop
  // pads an image smaller than the crop with zeros (torchvision's rule), so
  // its box may reach outside the image.
  int64_t height = 0;
  int64_t width = 0;
  int64_t max_size = 0;  // Resize with a shorter side only; 0 = none
  // RandomResizedCrop: area fraction and aspect-ratio ranges.
  double scale_min = 0.08, scale_max = 1.0;
  double ratio_min = 3.0 / 4.0, ratio_max = 4.0 / 3.0;
  // RandomHorizontalFlip: probability.
  double p = 0.5;

  static TransformStep resize(int64_t height, int64_t width, int64_t max_size = 0);
  static TransformStep center_crop(int64_t height, int64_t width);
  static TransformStep random_resized_crop(int64_t height, int64_t width, double scale_min = 0.08,
                                           double scale_max = 1.0, double ratio_min = 3.0 / 4.0,
                                           double ratio_max = 4.0 / 3.0);
  static TransformStep horizontal_flip(double p = 0.5);
};

enum class ImageLayout { kCHW, kHWC };

struct ImageOutput {
  DType dtype = DType::kU8;  // kU8, kF32, kF16 or kBF16
  ImageLayout layout = ImageLayout::kCHW;
  // One value per channel, or both empty (float output is then x / 255).
  std::vector<float> mean;
  std::vector<float> std;
};

// The concrete parameters one sample got, in the order applied: for
// reporting (debugging augmentations) and for tests.
struct TransformParams {
  int64_t image_width = 0;  // displayed size of the decoded image
  int64_t image_height = 0;
  // Each crop as (x, y, width, height) of the image it applied to, and each
  // resize's output size, in the order of the steps.
  std::vector<PixelBox> crops;
  std::vector<std::pair<int64_t, int64_t>> resizes;  // (height, width)
  std::vector<bool> flips;                           // each RandomHorizontalFlip's draw, in order
  bool flipped = false;  // the output is mirrored (an odd number of flips)
  int64_t output_width = 0;
  int64_t output_height = 0;
  double decode_scale = 1.0;  // JPEG DCT scaling used (1 = full size)
  bool corrupt_data = false;  // decoded through corrupt JPEG data (DecodedImage::corrupt_data)
};

class ImageTransform {
 public:
  // Throws InvalidArgument for a bad step (sizes < 1, empty or inverted
  // ranges, p outside [0, 1]) or output (a dtype other than the four, mean
  // and std of different lengths, a zero std, normalization with uint8).
  ImageTransform(std::vector<TransformStep> steps, ImageOutput output, int channels);

  const std::vector<TransformStep>& steps() const noexcept { return steps_; }
  const ImageOutput& output() const noexcept { return output_; }
  int channels() const noexcept { return channels_; }

  // The output shape when every sample gets the same one (the steps end in
  // a fixed size: RandomResizedCrop, CenterCrop, Resize to (h, w)); nullopt
  // otherwise.
  std::optional<Shape> fixed_shape() const;
  // The output shape for an output of `height` x `width`.
  Shape output_shape(int64_t height, int64_t width) const;

  // The parameters for an image of `width` x `height` (displayed), drawing
  // from `random` in step order. Pure arithmetic.
  TransformParams plan(int64_t width, int64_t height, SampleRandom& random) const;

  // Decodes and transforms one image into `dst` (exactly the bytes of
  // output_shape(params.output_height, params.output_width) in the output
  // dtype). `params` comes from plan(); its decode_scale and corrupt_data are filled in.
  // `scratch` holds decoded pixels between calls (keep one per thread).
  // Decoding errors are FormatError; they are thrown before `dst` is written.
  void run(std::span<const std::byte> bytes, const ImageInfo& info, const DecodeOptions& options,
           TransformParams& params, bool dct_scaling, std::span<std::byte> dst) const;

  // A short description of the steps and output, for messages and cache
  // fingerprints: "RandomResizedCrop(224x224, ...) | ... -> float32 CHW".
  std::string describe() const;

 private:
  std::vector<TransformStep> steps_;
  ImageOutput output_;
  int channels_;
  std::shared_ptr<const detail::OutputTables> tables_;
};

}  // namespace leanloader
