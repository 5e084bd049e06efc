#include "leanloader/image/image_source.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "image/scratch.h"
#include "io/file_io.h"
#include "leanloader/core/checked_size.h"
#include "leanloader/core/error.h"

namespace leanloader {

namespace {

// Headers read to estimate a typical output size when shapes vary.
constexpr size_t kSizeProbe = 8;
constexpr size_t kHeaderBytes = 64 * 1024;

// The file's bytes, in a buffer each thread reuses.
thread_local std::vector<std::byte> file_bytes;

std::span<const std::byte> read_file(const std::string& path) {
  std::vector<std::byte>& bytes = file_bytes;
  const detail::File file(path);
  detail::resize_scratch(bytes, file.size());
  file.read_exact(0, bytes);
  return bytes;
}

}  // namespace

ImageSource::ImageSource(std::vector<std::string> paths, std::vector<int64_t> labels,
                         ImageSourceOptions options)
    : paths_(std::move(paths)),
      labels_(std::move(labels)),
      options_(std::move(options)),
      transform_(options_.transforms, options_.output, color_mode_channels(options_.decode.mode)) {
  if (paths_.empty()) throw InvalidArgument("ImageSource needs at least one file");
  if (!labels_.empty() && labels_.size() != paths_.size()) {
    throw InvalidArgument("ImageSource has " + std::to_string(paths_.size()) + " files but " +
                          std::to_string(labels_.size()) + " labels");
  }
  const std::optional<Shape> shape = transform_.fixed_shape();
  specs_.push_back({"image", options_.output.dtype, shape});
  if (!labels_.empty()) specs_.push_back({"label", DType::kI64, Shape{}});

  // Plan a few images from their headers (arithmetic only): the output's
  // typical size when shapes vary, and what a thread holds while decoding.
  size_t total = 0, seen = 0;
  const size_t step = std::max<size_t>(1, paths_.size() / kSizeProbe);
  for (size_t i = 0; i < paths_.size() && seen < kSizeProbe; i += step) {
    try {
      const detail::File file(paths_[i]);
      const std::vector<std::byte> header = file.read_prefix(kHeaderBytes);
      const ImageInfo info = read_image_info(header, options_.decode);
      SampleRandom random(0, 0, i);
      const TransformParams params = transform_.plan(info.width, info.height, random);
      const size_t output =
          checked_nbytes(transform_.output_shape(params.output_height, params.output_width),
                         options_.output.dtype)
              .value_or(0);
      total += output;
      ++seen;
      const auto held = checked_add(decode_scratch_bytes(file.size(), info, params), output);
      scratch_bytes_ = std::max(scratch_bytes_, held.value_or(SIZE_MAX));
    } catch (const Error&) {
      // A header larger than the probe, or a bad file: its sample will say.
    }
  }
  const size_t label_bytes = labels_.empty() ? 0 : sizeof(int64_t);
  if (shape) {
    estimated_bytes_ = checked_nbytes(*shape, options_.output.dtype).value_or(0) + label_bytes;
  } else {
    estimated_bytes_ = (seen == 0 ? size_t{3} << 20 : total / seen) + label_bytes;
  }
}

size_t ImageSource::decode_scratch_bytes(size_t file_size, const ImageInfo& info,
                                         const TransformParams& params) const {
  const auto channels = static_cast<double>(color_mode_channels(options_.decode.mode));
  const auto width = static_cast<double>(info.width), height = static_cast<double>(info.height);
  // Each buffer is kept at the largest size a sample of the pass needed, so
  // the bound is the whole image: a random crop may take all of it.
  const double whole = width * height;
  // A JPEG with a resize after its crops decodes at the smallest DCT scale
  // n/8 that keeps the region at least 1.5 times the resize's output
  // (ImageTransform::run): under 1.5 x output + an eighth of the image on
  // each axis, whatever the region.
  double region = whole;
  if (info.format == ImageFormat::kJpeg && options_.dct_scaling && !params.resizes.empty()) {
    const auto [out_height, out_width] = params.resizes.front();
    region = std::min(whole, (1.5 * static_cast<double>(out_width) + width / 8 + 1) *
                                 (1.5 * static_cast<double>(out_height) + height / 8 + 1));
  }
  double pixels = info.format == ImageFormat::kJpeg ? region : whole;
  if (info.format == ImageFormat::kGif) pixels += whole / channels;  // its index plane
  if (info.orientation > 1) pixels *= 2;  // the decoded pixels and their turned copy
  // The first resize (the largest input) runs its horizontal pass on a
  // transposed copy of its input (RGBA: premultiplied into another first),
  // and each pass leaves rows of one output side by the other input side.
  if (!params.resizes.empty()) {
    const auto [out_height, out_width] = params.resizes.front();
    const double passes = 2 * std::max(static_cast<double>(out_width) * height,
                                       static_cast<double>(out_height) * width);
    pixels += (channels == 4 ? 2 : 1) * region + passes;
  }
  const double bytes = pixels * channels;
  const size_t held = bytes >= 0x1p64 ? SIZE_MAX : static_cast<size_t>(bytes);
  return checked_add(held, file_size).value_or(SIZE_MAX);
}

void ImageSource::check_index(int64_t index) const {
  if (index < 0 || index >= size()) {
    throw InvalidArgument("index " + std::to_string(index) + " out of range for " +
                          std::to_string(size()) + " images");
  }
}

void ImageSource::read_sample(int64_t index, SampleWriter& writer) const {
  check_index(index);
  const std::string& path = paths_[static_cast<size_t>(index)];
  const detail::ScratchTrim<std::byte, 1> trim({&file_bytes});
  std::span<const std::byte> bytes;
  try {
    bytes = read_file(path);
  } catch (const Error& e) {
    throw SampleError(index, describe(), path, "read", e);
  }
  ImageInfo info;
  TransformParams params;
  try {
    info = read_image_info(bytes, options_.decode);
    const SampleContext context = writer.context();
    SampleRandom random(context.seed, context.epoch, static_cast<uint64_t>(index));
    params = transform_.plan(info.width, info.height, random);
  } catch (const Error& e) {
    throw SampleError(index, describe(), path, "decode", e);
  }
  const std::span<std::byte> dst =
      writer.field_buffer(0, transform_.output_shape(params.output_height, params.output_width));
  try {
    transform_.run(bytes, info, options_.decode, params, options_.dct_scaling, dst);
  } catch (const Error& e) {
    throw SampleError(index, describe(), path, "decode", e);
  } catch (const std::bad_alloc&) {
    throw SampleError(index, describe(), path, "decode", "out of memory", ErrorKind::kOutOfMemory);
  }
  if (info.over_pixel_limit) {
    writer.warn(
        {pixel_limit_warning(path, info, options_.decode.max_pixels), WarningKind::kPixelLimit});
  }
  if (params.corrupt_data) writer.warn(corrupt_jpeg_warning(path));
  if (!labels_.empty()) {
    const std::span<std::byte> label = writer.field_buffer(1, Shape{});
    std::memcpy(label.data(), &labels_[static_cast<size_t>(index)], sizeof(int64_t));
  }
}

TransformParams ImageSource::sample_params(int64_t index, uint64_t seed, uint64_t epoch) const {
  check_index(index);
  const std::string& path = paths_[static_cast<size_t>(index)];
  std::span<const std::byte> bytes;
  try {
    bytes = read_file(path);
  } catch (const Error& e) {
    throw SampleError(index, describe(), path, "read", e);
  }
  try {
    const ImageInfo info = read_image_info(bytes, options_.decode);
    SampleRandom random(seed, epoch, static_cast<uint64_t>(index));
    return transform_.plan(info.width, info.height, random);
  } catch (const Error& e) {
    throw SampleError(index, describe(), path, "decode", e);
  }
}

std::string ImageSource::describe() const {
  return "ImageSource(" + std::to_string(paths_.size()) + " files, first '" + paths_.front() + "')";
}

std::string ImageSource::sample_location(int64_t index) const {
  if (index < 0 || index >= size()) return "";
  return paths_[static_cast<size_t>(index)];
}

}  // namespace leanloader
