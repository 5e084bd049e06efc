#include "leanloader/image/image_transform.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cfenv>
#include <cmath>
#include <cstring>
#include <mutex>
#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>
#include <sstream>

#include "image/resample.h"
#include "image/scratch.h"
#include "leanloader/core/checked_size.h"
#include "leanloader/core/error.h"

namespace leanloader {

namespace {

// A geometric operation left after planning (flips are moved to the end).
struct Op {
  bool crop = false;  // else resize
  PixelBox box;       // crop
  int64_t width = 0;  // resize target
  int64_t height = 0;
};

// Python's round(): halves go to the even neighbour.
int64_t round_half_even(double value) { return static_cast<int64_t>(std::nearbyint(value)); }

// torchvision's _compute_resized_output_size for Resize(size[, max_size]).
std::pair<int64_t, int64_t> resized_size(const TransformStep& step, int64_t width, int64_t height) {
  if (step.width > 0) return {step.height, step.width};
  const bool wide = width >= height;
  const int64_t shorter = wide ? height : width, longer = wide ? width : height;
  int64_t new_short = step.height;
  auto new_long = static_cast<int64_t>(static_cast<double>(new_short) *
                                       static_cast<double>(longer) / static_cast<double>(shorter));
  if (step.max_size > 0 && new_long > step.max_size) {
    new_short =
        static_cast<int64_t>(static_cast<double>(step.max_size) * static_cast<double>(new_short) /
                             static_cast<double>(new_long));
    new_long = step.max_size;
  }
  new_short = std::max<int64_t>(new_short, 1);
  new_long = std::max<int64_t>(new_long, 1);
  return wide ? std::pair{new_short, new_long} : std::pair{new_long, new_short};
}

// torchvision's RandomResizedCrop.get_params, line for line, with its
// uniform draws taken from `random` in the same order.
PixelBox random_resized_crop_box(const TransformStep& step, int64_t width, int64_t height,
                                 SampleRandom& random) {
  const double area = static_cast<double>(height) * static_cast<double>(width);
  const double log_ratio_min = std::log(step.ratio_min), log_ratio_max = std::log(step.ratio_max);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area = area * random.uniform(step.scale_min, step.scale_max);
    const double aspect_ratio = std::exp(random.uniform(log_ratio_min, log_ratio_max));
    const int64_t w = round_half_even(std::sqrt(target_area * aspect_ratio));
    const int64_t h = round_half_even(std::sqrt(target_area / aspect_ratio));
    if (0 < w && w <= width && 0 < h && h <= height) {
      const int64_t i = random.below(height - h + 1);
      const int64_t j = random.below(width - w + 1);
      return {j, i, w, h};
    }
  }
  // Fallback to a central crop, clamped to the ratio range.
  const double in_ratio = static_cast<double>(width) / static_cast<double>(height);
  int64_t w = width, h = height;
  if (in_ratio < std::min(step.ratio_min, step.ratio_max)) {
    w = width;
    h = round_half_even(static_cast<double>(w) / std::min(step.ratio_min, step.ratio_max));
  } else if (in_ratio > std::max(step.ratio_min, step.ratio_max)) {
    h = height;
    w = round_half_even(static_cast<double>(h) * std::max(step.ratio_min, step.ratio_max));
  }
  w = std::clamp<int64_t>(w, 1, width);
  h = std::clamp<int64_t>(h, 1, height);
  return {(width - w) / 2, (height - h) / 2, w, h};
}

TransformParams make_plan(const std::vector<TransformStep>& steps, int64_t width, int64_t height,
                          SampleRandom& random) {
  TransformParams params;
  params.image_width = width;
  params.image_height = height;
  bool flip = false;
  auto add_crop = [&](PixelBox box) {
    params.crops.push_back(box);
    width = box.width;
    height = box.height;
  };
  auto add_resize = [&](int64_t w, int64_t h) {
    params.resizes.emplace_back(h, w);
    width = w;
    height = h;
  };
  for (const TransformStep& step : steps) {
    switch (step.kind) {
      case TransformStep::Kind::kResize: {
        const auto [h, w] = resized_size(step, width, height);
        add_resize(w, h);
        break;
      }
      case TransformStep::Kind::kCenterCrop: {
        // torchvision's center_crop: an image smaller than the crop is padded
        // with zeros (left/top get the smaller half), then cropped at the
        // center. The box is in the unpadded image and may reach outside it.
        const int64_t pad_left = step.width > width ? (step.width - width) / 2 : 0;
        const int64_t pad_top = step.height > height ? (step.height - height) / 2 : 0;
        const int64_t padded_width = std::max(width, step.width);
        const int64_t padded_height = std::max(height, step.height);
        const int64_t top = round_half_even(static_cast<double>(padded_height - step.height) / 2.0);
        const int64_t left = round_half_even(static_cast<double>(padded_width - step.width) / 2.0);
        add_crop({left - pad_left, top - pad_top, step.width, step.height});
        break;
      }
      case TransformStep::Kind::kRandomResizedCrop: {
        add_crop(random_resized_crop_box(step, width, height, random));
        add_resize(step.width, step.height);
        break;
      }
      case TransformStep::Kind::kHorizontalFlip: {
        const bool draw = random.uniform() < step.p;
        params.flips.push_back(draw);
        if (draw) flip = !flip;
        break;
      }
    }
  }
  params.flipped = flip;
  params.output_width = width;
  params.output_height = height;
  return params;
}

// A read-only view of interleaved 8-bit pixels.
struct View {
  const uint8_t* data = nullptr;
  int64_t width = 0;
  int64_t height = 0;
  int channels = 0;
  size_t stride = 0;  // bytes per row

  cv::Mat mat() const {
    return cv::Mat(static_cast<int>(height), static_cast<int>(width), CV_8UC(channels),
                   const_cast<uint8_t*>(data), stride);
  }
};

// The part of `box` inside a width x height image (empty boxes have width or
// height 0).
PixelBox intersect(const PixelBox& box, int64_t width, int64_t height) {
  const int64_t x0 = std::clamp<int64_t>(box.x, 0, width);
  const int64_t y0 = std::clamp<int64_t>(box.y, 0, height);
  const int64_t x1 = std::clamp<int64_t>(box.x + box.width, 0, width);
  const int64_t y1 = std::clamp<int64_t>(box.y + box.height, 0, height);
  return {x0, y0, x1 - x0, y1 - y0};
}

// `box` of `from` (reaching outside it) in `canvas`: zeros outside, as
// torchvision's pad(fill=0).
View pad_into(const View& from, const PixelBox& box, std::vector<uint8_t>& canvas) {
  const auto channels = static_cast<size_t>(from.channels);
  const size_t row = static_cast<size_t>(box.width) * channels;
  detail::resize_scratch(canvas, row * static_cast<size_t>(box.height));
  std::fill(canvas.begin(), canvas.end(), uint8_t{0});
  const PixelBox inside = intersect(box, from.width, from.height);
  for (int64_t y = 0; y < inside.height; ++y) {
    const uint8_t* source = from.data + static_cast<size_t>(inside.y + y) * from.stride +
                            static_cast<size_t>(inside.x) * channels;
    uint8_t* target = canvas.data() + static_cast<size_t>(inside.y - box.y + y) * row +
                      static_cast<size_t>(inside.x - box.x) * channels;
    std::memcpy(target, source, static_cast<size_t>(inside.width) * channels);
  }
  return {canvas.data(), box.width, box.height, from.channels, row};
}

// Pillow resizes RGBA premultiplied: Image.resize converts RGBA to "RGBa"
// (c * a / 255, rounded: MULDIV255), resizes, and converts back (c * 255 / a,
// truncated, clipped; a of 0 or 255 left as is), so that the colour of a
// transparent pixel does not bleed into its neighbours.
void premultiply(const View& from, std::vector<uint8_t>& out) {
  const size_t row = static_cast<size_t>(from.width) * 4;
  detail::resize_scratch(out, row * static_cast<size_t>(from.height));
  for (int64_t y = 0; y < from.height; ++y) {
    const uint8_t* in = from.data + static_cast<size_t>(y) * from.stride;
    uint8_t* to = out.data() + static_cast<size_t>(y) * row;
    for (size_t i = 0; i < row; i += 4) {
      const uint32_t alpha = in[i + 3];
      for (size_t c = 0; c < 3; ++c) {
        const uint32_t t = in[i + c] * alpha + 128;
        to[i + c] = static_cast<uint8_t>(((t >> 8) + t) >> 8);
      }
      to[i + 3] = static_cast<uint8_t>(alpha);
    }
  }
}

void unpremultiply(uint8_t* pixels, size_t count) {
  for (size_t i = 0; i < count * 4; i += 4) {
    const uint32_t alpha = pixels[i + 3];
    if (alpha == 0 || alpha == 255) continue;
    for (size_t c = 0; c < 3; ++c) {
      pixels[i + c] = static_cast<uint8_t>(std::min<uint32_t>(255, 255 * pixels[i + c] / alpha));
    }
  }
}

// Pillow's Image.resize(..., BILINEAR, box), bit for bit (image/resample.h): a
// triangle filter widened by each axis's shrink factor, so that every
// shrinking axis is antialiased whatever the other one does; `box` is the
// whole image, or for a DCT-scaled decode widened to whole pixels the
// fractional region (rounding it to whole pixels would shift the crop by up
// to half an output pixel). Against Pillow's full-size decode resized, such
// a DCT-scaled region (at least 1.5x the output, see decode_and_transform)
// measured 42.7 dB at worst and 43.7 median over 144 RandomResizedCrop boxes
// of three photos (OpenCV's Gaussian + warpAffine at 1x, used before: 36.9 /
// 41.6).
void resize_box_into(const View& from, double x, double y, double w, double h, int64_t width,
                     int64_t height, uint8_t* to, std::vector<uint8_t>& scratch) {
  thread_local std::vector<uint8_t> premultiplied;
  const detail::ScratchTrim<uint8_t, 1> trim({&premultiplied});
  detail::PixelPlane plane{from.data, from.width, from.height, from.channels, from.stride};
  if (from.channels == 4) {
    premultiply(from, premultiplied);
    plane.data = premultiplied.data();
    plane.stride = static_cast<size_t>(from.width) * 4;
  }
  detail::resample_bilinear(plane, static_cast<float>(x), static_cast<float>(y),
                            static_cast<float>(x + w), static_cast<float>(y + h), width, height, to,
                            scratch);
  if (from.channels == 4)
    unpremultiply(to, static_cast<size_t>(width) * static_cast<size_t>(height));
}

void resize_into(const View& from, int64_t width, int64_t height, uint8_t* to,
                 std::vector<uint8_t>& scratch) {
  resize_box_into(from, 0.0, 0.0, static_cast<double>(from.width), static_cast<double>(from.height),
                  width, height, to, scratch);
}

uint16_t float_to_half(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t abs = bits & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u)
    return static_cast<uint16_t>(sign | 0x7C00u | (abs > 0x7F800000u ? 0x200u : 0));
  if (abs >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // rounds to inf
  if (abs < 0x38800000u) {                                          // subnormal or zero in half
    const float magnitude = std::bit_cast<float>(abs) * 0x1.0p24f;  // units of 2^-24
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(magnitude)));
  }
  const uint32_t rounded = abs + 0xFFFu + ((abs >> 13) & 1u);  // round to nearest even
  return static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
}

uint16_t float_to_bfloat16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

// Each output value is a function of (channel, byte): a table per channel in
// the output type makes the write a lookup and a store.
template <class T>
using ChannelTables = std::vector<std::array<T, 256>>;

template <class T>
void write_through_tables(const View& from, bool flip, bool chw, const ChannelTables<T>& tables,
                          T* out) {
  const auto width = static_cast<size_t>(from.width), height = static_cast<size_t>(from.height);
  const auto channels = static_cast<size_t>(from.channels);
  if (chw && channels == 3) {
    // RGB, the common case: one sequential pass over the pixels feeds the
    // three planes (instead of three strided passes).
    const std::array<T, 256>&r = tables[0], &g = tables[1], &b = tables[2];
    for (size_t y = 0; y < height; ++y) {
      const uint8_t* row = from.data + y * from.stride;
      T* red = out + y * width;
      T* green = red + height * width;
      T* blue = green + height * width;
      for (size_t x = 0; x < width; ++x) {
        const uint8_t* pixel = row + (flip ? width - 1 - x : x) * 3;
        red[x] = r[pixel[0]];
        green[x] = g[pixel[1]];
        blue[x] = b[pixel[2]];
      }
    }
    return;
  }
  if (chw) {
    for (size_t c = 0; c < channels; ++c) {
      const std::array<T, 256>& table = tables[c];
      for (size_t y = 0; y < height; ++y) {
        const uint8_t* row = from.data + y * from.stride + c;
        T* line = out + (c * height + y) * width;
        if (flip) {
          for (size_t x = 0; x < width; ++x) line[x] = table[row[(width - 1 - x) * channels]];
        } else {
          for (size_t x = 0; x < width; ++x) line[x] = table[row[x * channels]];
        }
      }
    }
    return;
  }
  for (size_t y = 0; y < height; ++y) {
    const uint8_t* row = from.data + y * from.stride;
    T* line = out + y * width * channels;
    for (size_t x = 0; x < width; ++x) {
      const uint8_t* pixel = row + (flip ? width - 1 - x : x) * channels;
      for (size_t c = 0; c < channels; ++c) line[x * channels + c] = tables[c][pixel[c]];
    }
  }
}

}  // namespace

namespace detail {

struct OutputTables {
  ChannelTables<uint8_t> bytes;
  ChannelTables<float> floats;
  ChannelTables<uint16_t> halves;  // float16 or bfloat16 bits
};

}  // namespace detail

namespace {

std::shared_ptr<const detail::OutputTables> make_tables(const ImageOutput& output, int channels) {
  auto tables = std::make_shared<detail::OutputTables>();
  const auto count = static_cast<size_t>(channels);
  if (output.dtype == DType::kU8) {
    tables->bytes.resize(count);
    for (auto& table : tables->bytes) {
      for (size_t v = 0; v < 256; ++v) table[v] = static_cast<uint8_t>(v);
    }
    return tables;
  }
  // torchvision's arithmetic in float32: ToTensor's x / 255, then
  // (x - mean) / std.
  tables->floats.resize(count);
  for (size_t c = 0; c < count; ++c) {
    for (size_t v = 0; v < 256; ++v) {
      float x = static_cast<float>(v) / 255.0f;
      if (!output.mean.empty()) x = (x - output.mean[c]) / output.std[c];
      tables->floats[c][v] = x;
    }
  }
  if (output.dtype != DType::kF32) {
    tables->halves.resize(count);
    for (size_t c = 0; c < count; ++c) {
      for (size_t v = 0; v < 256; ++v) {
        const float x = tables->floats[c][v];
        tables->halves[c][v] =
            output.dtype == DType::kF16 ? float_to_half(x) : float_to_bfloat16(x);
      }
    }
  }
  return tables;
}

// Writes `from` (flipped if asked) in the output's layout and dtype.
void write_output(const View& from, bool flip, const ImageOutput& output,
                  const detail::OutputTables& tables, std::byte* dst) {
  const auto channels = static_cast<size_t>(from.channels);
  const bool chw = output.layout == ImageLayout::kCHW;
  switch (output.dtype) {
    case DType::kU8:
      if (!chw && !flip) {
        const size_t row = static_cast<size_t>(from.width) * channels;
        for (int64_t y = 0; y < from.height; ++y) {
          std::memcpy(dst + static_cast<size_t>(y) * row,
                      from.data + static_cast<size_t>(y) * from.stride, row);
        }
        return;
      }
      write_through_tables(from, flip, chw, tables.bytes, reinterpret_cast<uint8_t*>(dst));
      return;
    case DType::kF32:
      write_through_tables(from, flip, chw, tables.floats, reinterpret_cast<float*>(dst));
      return;
    default:
      write_through_tables(from, flip, chw, tables.halves, reinterpret_cast<uint16_t*>(dst));
      return;
  }
}

std::string dtype_label(DType dtype) { return std::string(dtype_name(dtype)); }

}  // namespace

TransformStep TransformStep::resize(int64_t height, int64_t width, int64_t max_size) {
  TransformStep step;
  step.kind = Kind::kResize;
  step.height = height;
  step.width = width;
  step.max_size = max_size;
  return step;
}

TransformStep TransformStep::center_crop(int64_t height, int64_t width) {
  TransformStep step;
  step.kind = Kind::kCenterCrop;
  step.height = height;
  step.width = width;
  return step;
}

TransformStep TransformStep::random_resized_crop(int64_t height, int64_t width, double scale_min,
                                                 double scale_max, double ratio_min,
                                                 double ratio_max) {
  TransformStep step;
  step.kind = Kind::kRandomResizedCrop;
  step.height = height;
  step.width = width;
  step.scale_min = scale_min;
  step.scale_max = scale_max;
  step.ratio_min = ratio_min;
  step.ratio_max = ratio_max;
  return step;
}

TransformStep TransformStep::horizontal_flip(double p) {
  TransformStep step;
  step.kind = Kind::kHorizontalFlip;
  step.p = p;
  return step;
}

ImageTransform::ImageTransform(std::vector<TransformStep> steps, ImageOutput output, int channels)
    : steps_(std::move(steps)), output_(std::move(output)), channels_(channels) {
  // The loader's threads are the parallelism: OpenCV's own pool would run
  // each resize on every core again and oversubscribe them.
  static std::once_flag sequential_opencv;
  std::call_once(sequential_opencv, [] { cv::setNumThreads(0); });
  constexpr int64_t kMaxSide = 1 << 20;
  for (const TransformStep& step : steps_) {
    const bool sized = step.kind != TransformStep::Kind::kHorizontalFlip;
    const bool shorter_side = step.kind == TransformStep::Kind::kResize && step.width == 0;
    if (sized && (step.height < 1 || step.height > kMaxSide ||
                  (!shorter_side && (step.width < 1 || step.width > kMaxSide)))) {
      throw InvalidArgument("transform sizes must be between 1 and " + std::to_string(kMaxSide) +
                            ", got " + std::to_string(step.height) + "x" +
                            std::to_string(step.width));
    }
    if (step.max_size < 0 || (step.max_size > 0 && !shorter_side) ||
        (shorter_side && step.max_size > 0 && step.max_size <= step.height)) {
      throw InvalidArgument("Resize max_size applies to a shorter-side size and must exceed it");
    }
    if (step.kind == TransformStep::Kind::kRandomResizedCrop &&
        !(step.scale_min >= 0 && step.scale_min <= step.scale_max && step.ratio_min > 0 &&
          step.ratio_min <= step.ratio_max)) {
      throw InvalidArgument(
          "RandomResizedCrop needs 0 <= scale[0] <= scale[1] and 0 < ratio[0] <= ratio[1]");
    }
    if (step.kind == TransformStep::Kind::kHorizontalFlip && !(step.p >= 0 && step.p <= 1)) {
      throw InvalidArgument("RandomHorizontalFlip p must be in [0, 1], got " +
                            std::to_string(step.p));
    }
  }
  const DType dtype = output_.dtype;
  if (dtype != DType::kU8 && dtype != DType::kF32 && dtype != DType::kF16 &&
      dtype != DType::kBF16) {
    throw InvalidArgument("image output dtype must be uint8, float32, float16 or bfloat16, got " +
                          dtype_label(dtype));
  }
  if (output_.mean.size() != output_.std.size()) {
    throw InvalidArgument("Normalize needs mean and std of the same length");
  }
  if (!output_.mean.empty()) {
    if (dtype == DType::kU8) {
      throw InvalidArgument("Normalize gives floats: choose float32, float16 or bfloat16");
    }
    if (output_.mean.size() == 1) {
      output_.mean.assign(static_cast<size_t>(channels_), output_.mean[0]);
      output_.std.assign(static_cast<size_t>(channels_), output_.std[0]);
    }
    if (output_.mean.size() != static_cast<size_t>(channels_)) {
      throw InvalidArgument("Normalize has " + std::to_string(output_.mean.size()) +
                            " values for " + std::to_string(channels_) + " channels");
    }
    for (const float s : output_.std) {
      if (!(s != 0.0f) || !std::isfinite(s)) {
        throw InvalidArgument("Normalize std must be finite and non-zero");
      }
    }
  }
  tables_ = make_tables(output_, channels_);
}

std::optional<Shape> ImageTransform::fixed_shape() const {
  for (auto step = steps_.rbegin(); step != steps_.rend(); ++step) {
    switch (step->kind) {
      case TransformStep::Kind::kHorizontalFlip:
        continue;
      case TransformStep::Kind::kResize:
        if (step->width == 0) return std::nullopt;
        [[fallthrough]];
      case TransformStep::Kind::kCenterCrop:
      case TransformStep::Kind::kRandomResizedCrop:
        return output_shape(step->height, step->width);
    }
  }
  return std::nullopt;
}

Shape ImageTransform::output_shape(int64_t height, int64_t width) const {
  if (output_.layout == ImageLayout::kCHW) return {channels_, height, width};
  return {height, width, channels_};
}

TransformParams ImageTransform::plan(int64_t width, int64_t height, SampleRandom& random) const {
  return make_plan(steps_, width, height, random);
}

void ImageTransform::run(std::span<const std::byte> bytes, const ImageInfo& info,
                         const DecodeOptions& options, TransformParams& params, bool dct_scaling,
                         std::span<std::byte> dst) const {
  // The ops follow from the parameters (torchvision's boxes, in the order of
  // the steps): a crop after a flip is mirrored so that the flip can be done
  // last, while writing the output.
  std::vector<Op> ops;
  {
    int64_t width = params.image_width, height = params.image_height;
    size_t crop = 0, resize = 0, flip_step = 0;
    bool flip = false;
    for (const TransformStep& step : steps_) {
      auto add_crop = [&](PixelBox box) {
        if (flip) box.x = width - box.x - box.width;
        if (box.x != 0 || box.y != 0 || box.width != width || box.height != height) {
          ops.push_back({true, box, 0, 0});
        }
        width = box.width;
        height = box.height;
      };
      auto add_resize = [&](int64_t w, int64_t h) {
        if (w != width || h != height) ops.push_back({false, {}, w, h});
        width = w;
        height = h;
      };
      switch (step.kind) {
        case TransformStep::Kind::kResize: {
          const auto [h, w] = params.resizes.at(resize++);
          add_resize(w, h);
          break;
        }
        case TransformStep::Kind::kCenterCrop:
          add_crop(params.crops.at(crop++));
          break;
        case TransformStep::Kind::kRandomResizedCrop: {
          add_crop(params.crops.at(crop++));
          const auto [h, w] = params.resizes.at(resize++);
          add_resize(w, h);
          break;
        }
        case TransformStep::Kind::kHorizontalFlip:
          if (params.flips.at(flip_step++)) flip = !flip;
          break;
      }
    }
  }
  const std::optional<size_t> expected =
      checked_nbytes(output_shape(params.output_height, params.output_width), output_.dtype);
  if (!expected || *expected != dst.size()) {
    throw InvalidArgument("image destination holds " + std::to_string(dst.size()) +
                          " bytes, the output needs " + std::to_string(expected.value_or(0)));
  }
  if (color_mode_channels(options.mode) != channels_) {
    throw InvalidArgument("the decode color mode does not give the transform's channels");
  }

  // Straight into the destination: nothing to crop, resize or flip, pixels
  // as decoded.
  if (ops.empty() && !params.flipped && output_.dtype == DType::kU8 &&
      output_.layout == ImageLayout::kHWC) {
    params.corrupt_data = decode_image_into(bytes, info, options,
                                            {reinterpret_cast<uint8_t*>(dst.data()), dst.size()});
    params.decode_scale = 1.0;
    return;
  }

  // Leading crops become the decode region; the first resize after them
  // bounds the DCT scaling. A region reaching outside the image (CenterCrop
  // padding) decodes the part inside at full size and pads it.
  PixelBox region{0, 0, info.width, info.height};
  size_t next = 0;
  for (; next < ops.size() && ops[next].crop; ++next) {
    region = {region.x + ops[next].box.x, region.y + ops[next].box.y, ops[next].box.width,
              ops[next].box.height};
  }
  const PixelBox inside = intersect(region, info.width, info.height);
  const bool padded = !(inside == region);
  DecodeRequest request{inside, 0, 0};
  if (dct_scaling && !padded && next < ops.size()) {
    // At least 1.5 times the output on each axis: the resampler's triangle
    // filter then does the last shrink, which keeps a scaled decode within
    // 42.7 dB of Pillow's full decode and resize at worst (at 1x the output:
    // 39.0 dB; 144 RandomResizedCrop boxes of three photos).
    request.min_width = ops[next].width + ops[next].width / 2;
    request.min_height = ops[next].height + ops[next].height / 2;
  }
  thread_local DecodedImage decoded;
  thread_local std::vector<uint8_t> buffers[2];
  thread_local std::vector<uint8_t> blurred;
  const detail::ScratchTrim<uint8_t, 4> trim({&decoded.pixels, &buffers[0], &buffers[1], &blurred});
  if (inside.width > 0 && inside.height > 0) {
    decode_image(bytes, info, options, request, decoded);
  } else {  // the region lies in the padding only: nothing to decode
    decoded.pixels.clear();
    decoded.corrupt_data = false;
    decoded.width = decoded.height = 0;
    decoded.channels = channels_;
    decoded.scale = 1.0;
    decoded.region_x = decoded.region_y = decoded.region_width = decoded.region_height = 0;
  }
  params.decode_scale = decoded.scale;
  params.corrupt_data = decoded.corrupt_data;

  View view{decoded.pixels.data(), decoded.width, decoded.height, decoded.channels,
            static_cast<size_t>(decoded.width) * static_cast<size_t>(decoded.channels)};
  int spare = 0;
  if (padded) {
    view = pad_into(view, {region.x - inside.x, region.y - inside.y, region.width, region.height},
                    buffers[spare]);
    spare ^= 1;
  }
  // A shrunk decode holds the region at a fractional place: the first resize
  // samples it there.
  bool fractional = decoded.region_x != 0.0 || decoded.region_y != 0.0 ||
                    decoded.region_width != static_cast<double>(decoded.width) ||
                    decoded.region_height != static_cast<double>(decoded.height);
  const bool direct_last =
      !params.flipped && output_.dtype == DType::kU8 && output_.layout == ImageLayout::kHWC;
  for (; next < ops.size(); ++next) {
    const Op& op = ops[next];
    if (op.crop) {
      if (!(intersect(op.box, view.width, view.height) == op.box)) {
        view = pad_into(view, op.box, buffers[spare]);
        spare ^= 1;
        continue;
      }
      view.data += static_cast<size_t>(op.box.y) * view.stride +
                   static_cast<size_t>(op.box.x) * static_cast<size_t>(view.channels);
      view.width = op.box.width;
      view.height = op.box.height;
      continue;
    }
    const size_t row = static_cast<size_t>(op.width) * static_cast<size_t>(view.channels);
    const bool last = direct_last && next + 1 == ops.size();
    std::vector<uint8_t>& target = buffers[spare];
    if (!last) {
      spare ^= 1;
      detail::resize_scratch(target, row * static_cast<size_t>(op.height));
    }
    uint8_t* out = last ? reinterpret_cast<uint8_t*>(dst.data()) : target.data();
    if (fractional) {
      resize_box_into(view, decoded.region_x, decoded.region_y, decoded.region_width,
                      decoded.region_height, op.width, op.height, out, blurred);
      fractional = false;
    } else {
      resize_into(view, op.width, op.height, out, blurred);
    }
    if (last) return;
    view = View{target.data(), op.width, op.height, view.channels, row};
  }
  write_output(view, params.flipped, output_, *tables_, dst.data());
}

std::string ImageTransform::describe() const {
  std::ostringstream text;
  for (const TransformStep& step : steps_) {
    switch (step.kind) {
      case TransformStep::Kind::kResize:
        if (step.width == 0) {
          text << "Resize(" << step.height;
          if (step.max_size > 0) text << ", max_size=" << step.max_size;
          text << ")";
        } else {
          text << "Resize(" << step.height << "x" << step.width << ")";
        }
        break;
      case TransformStep::Kind::kCenterCrop:
        text << "CenterCrop(" << step.height << "x" << step.width << ")";
        break;
      case TransformStep::Kind::kRandomResizedCrop:
        text << "RandomResizedCrop(" << step.height << "x" << step.width << ", scale=("
             << step.scale_min << ", " << step.scale_max << "), ratio=(" << step.ratio_min << ", "
             << step.ratio_max << "))";
        break;
      case TransformStep::Kind::kHorizontalFlip:
        text << "RandomHorizontalFlip(" << step.p << ")";
        break;
    }
    text << " | ";
  }
  if (!output_.mean.empty()) {
    text << "Normalize(mean=[";
    for (size_t c = 0; c < output_.mean.size(); ++c) text << (c ? ", " : "") << output_.mean[c];
    text << "], std=[";
    for (size_t c = 0; c < output_.std.size(); ++c) text << (c ? ", " : "") << output_.std[c];
    text << "]) | ";
  }
  text << "-> " << dtype_name(output_.dtype) << " "
       << (output_.layout == ImageLayout::kCHW ? "CHW" : "HWC") << " " << channels_ << "ch";
  return text.str();
}

}  // namespace leanloader
