#include "leanloader/image/image_decoder.h"

#include <algorithm>
#include <cstring>
#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>
#include <string>
#include <utility>

#include "image/codecs.h"
#include "image/pillow_pixels.h"
#include "image/scratch.h"
#include "leanloader/core/checked_size.h"
#include "leanloader/core/error.h"

namespace leanloader {

namespace detail {

void rgb_to_gray_in_place(uint8_t* pixels, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    const uint8_t* rgb = pixels + 3 * i;
    pixels[i] = pillow_luma(rgb[0], rgb[1], rgb[2]);
  }
}

}  // namespace detail

namespace {

using detail::StoredSize;

bool turns(int orientation) { return orientation >= 5; }

StoredSize stored_size(const ImageInfo& info) {
  return turns(info.orientation) ? StoredSize{info.height, info.width}
                                 : StoredSize{info.width, info.height};
}

// The stored-image box whose pixels, oriented, are the displayed box `box`.
PixelBox stored_box(const PixelBox& box, StoredSize stored, int orientation) {
  const int64_t W = stored.width, H = stored.height;
  switch (orientation) {
    case 2:
      return {W - box.x - box.width, box.y, box.width, box.height};
    case 3:
      return {W - box.x - box.width, H - box.y - box.height, box.width, box.height};
    case 4:
      return {box.x, H - box.y - box.height, box.width, box.height};
    case 5:
      return {box.y, box.x, box.height, box.width};
    case 6:
      return {box.y, H - box.x - box.width, box.height, box.width};
    case 7:
      return {W - box.y - box.height, H - box.x - box.width, box.height, box.width};
    case 8:
      return {W - box.y - box.height, box.x, box.height, box.width};
    default:
      return box;
  }
}

// Applies EXIF orientation to `image` (as Pillow's exif_transpose), through
// `spare` (swapped in).
void orient(DecodedImage& image, int orientation, std::vector<uint8_t>& spare) {
  if (orientation <= 1) return;
  const int type = CV_8UC(image.channels);
  const cv::Mat source(static_cast<int>(image.height), static_cast<int>(image.width), type,
                       image.pixels.data());
  const bool turned = turns(orientation);
  const int64_t width = turned ? image.height : image.width;
  const int64_t height = turned ? image.width : image.height;
  detail::resize_scratch(spare, image.pixels.size());
  cv::Mat target(static_cast<int>(height), static_cast<int>(width), type, spare.data());
  switch (orientation) {
    case 2:
      cv::flip(source, target, 1);
      break;
    case 3:
      cv::flip(source, target, -1);
      break;
    case 4:
      cv::flip(source, target, 0);
      break;
    case 5:
      cv::transpose(source, target);
      break;
    case 6:
      cv::rotate(source, target, cv::ROTATE_90_CLOCKWISE);
      break;
    case 7:
      cv::transpose(source, target);
      cv::flip(target, target, -1);
      break;
    case 8:
      cv::rotate(source, target, cv::ROTATE_90_COUNTERCLOCKWISE);
      break;
    default:
      break;
  }
  std::swap(image.pixels, spare);
  image.width = width;
  image.height = height;
}

// Cuts `box` out of a whole decoded image, in place.
void cut(DecodedImage& image, const PixelBox& box) {
  if (box.x == 0 && box.y == 0 && box.width == image.width && box.height == image.height) return;
  const size_t channels = static_cast<size_t>(image.channels);
  const size_t row = static_cast<size_t>(box.width) * channels;
  const size_t stride = static_cast<size_t>(image.width) * channels;
  uint8_t* base = image.pixels.data();
  for (int64_t y = 0; y < box.height; ++y) {
    const uint8_t* from =
        base + static_cast<size_t>(box.y + y) * stride + static_cast<size_t>(box.x) * channels;
    std::memmove(base + static_cast<size_t>(y) * row, from, row);
  }
  image.pixels.resize(row * static_cast<size_t>(box.height));
  image.width = box.width;
  image.height = box.height;
}

size_t image_bytes(int64_t width, int64_t height, int channels) {
  const int64_t shape[] = {height, width, channels};
  const auto bytes = checked_numel(shape);
  if (!bytes) throw FormatError("image size overflows");
  return *bytes;
}

// Returns DecodedImage::corrupt_data.
bool decode_whole(std::span<const std::byte> bytes, ImageFormat format, StoredSize size,
                  const DecodeOptions& options, std::span<uint8_t> dst) {
  DecodedImage notes;
  switch (format) {
    case ImageFormat::kJpeg:
      detail::jpeg_decode(bytes, options, {0, 0, size.width, size.height}, 0, 0, notes, dst);
      return notes.corrupt_data;
    case ImageFormat::kPng:
      detail::png_decode(bytes, options, size, dst);
      return false;
    case ImageFormat::kWebp:
      detail::webp_decode(bytes, options, size, {0, 0, size.width, size.height}, dst);
      return false;
    case ImageFormat::kPnm:
      detail::pnm_decode(bytes, options, size, dst);
      return false;
    case ImageFormat::kTiff:
      detail::tiff_decode(bytes, options, size, dst);
      return false;
    case ImageFormat::kBmp:
      detail::bmp_decode(bytes, options, size, dst);
      return false;
    case ImageFormat::kGif:
      detail::gif_decode(bytes, options, size, dst);
      return false;
    case ImageFormat::kUnknown:
      break;
  }
  throw FormatError("not a JPEG, PNG, WebP, PPM/PGM/PBM, TIFF, BMP or GIF image");
}

}  // namespace

int color_mode_channels(ColorMode mode) noexcept {
  switch (mode) {
    case ColorMode::kGray:
      return 1;
    case ColorMode::kRGBA:
      return 4;
    case ColorMode::kRGB:
      break;
  }
  return 3;
}

ImageInfo read_image_info(std::span<const std::byte> bytes, const DecodeOptions& options) {
  ImageInfo info;
  info.format = detect_image_format(bytes);
  StoredSize size;
  switch (info.format) {
    case ImageFormat::kJpeg:
      size = detail::jpeg_size(bytes);
      break;
    case ImageFormat::kPng:
      size = detail::png_size(bytes);
      break;
    case ImageFormat::kWebp:
      size = detail::webp_size(bytes);
      break;
    case ImageFormat::kPnm:
      size = detail::pnm_size(bytes);
      break;
    case ImageFormat::kTiff:
      size = detail::tiff_size(bytes);
      break;
    case ImageFormat::kBmp:
      size = detail::bmp_size(bytes);
      break;
    case ImageFormat::kGif:
      size = detail::gif_size(bytes);
      break;
    case ImageFormat::kUnknown:
      if (bytes.empty()) throw FormatError("empty file (0 bytes), not an image");
      throw FormatError(
          "not a JPEG, PNG, WebP, PPM/PGM/PBM, TIFF, BMP or GIF image (unknown signature)");
  }
  const std::string name(image_format_name(info.format));
  if (size.width <= 0 || size.height <= 0) {
    throw FormatError(name + ": bad size " + std::to_string(size.width) + "x" +
                      std::to_string(size.height));
  }
  const auto pixels =
      checked_mul(static_cast<size_t>(size.width), static_cast<size_t>(size.height));
  const auto refused_above = checked_mul(options.max_pixels, uint64_t{2});
  if (!pixels || (options.max_pixels != 0 && (!refused_above || *pixels > *refused_above))) {
    throw FormatError(name + ": " + std::to_string(size.width) + "x" + std::to_string(size.height) +
                      " pixels exceed twice the limit of " + std::to_string(options.max_pixels) +
                      " (a possible decompression bomb, as Pillow refuses it; raise max_pixels, "
                      "or pass None, to allow it)");
  }
  info.over_pixel_limit = options.max_pixels != 0 && *pixels > options.max_pixels;
  // Pillow applies a TIFF's Orientation tag on every load (TiffImagePlugin's
  // load_end calls exif_transpose), so Image.open(path).convert("RGB") is the
  // oriented image; the other formats' tags only when asked.
  if (options.exif_orientation || info.format == ImageFormat::kTiff) {
    info.orientation = detail::exif_orientation(bytes, info.format).value_or(1);
  }
  info.width = turns(info.orientation) ? size.height : size.width;
  info.height = turns(info.orientation) ? size.width : size.height;
  return info;
}

void decode_image(std::span<const std::byte> bytes, const ImageInfo& info,
                  const DecodeOptions& options, const DecodeRequest& request, DecodedImage& out) {
  PixelBox box = request.region;
  if (box.width == 0 || box.height == 0) box = {0, 0, info.width, info.height};
  if (box.x < 0 || box.y < 0 || box.width < 1 || box.height < 1 || box.x + box.width > info.width ||
      box.y + box.height > info.height) {
    throw InvalidArgument("decode region " + std::to_string(box.width) + "x" +
                          std::to_string(box.height) + "+" + std::to_string(box.x) + "+" +
                          std::to_string(box.y) + " is outside the " + std::to_string(info.width) +
                          "x" + std::to_string(info.height) + " image");
  }
  const StoredSize size = stored_size(info);
  const PixelBox stored = stored_box(box, size, info.orientation);
  const int channels = color_mode_channels(options.mode);
  out.corrupt_data = false;
  if (info.format == ImageFormat::kJpeg) {
    const bool turned = turns(info.orientation);
    detail::jpeg_decode(bytes, options, stored, turned ? request.min_height : request.min_width,
                        turned ? request.min_width : request.min_height, out, {});
  } else if (info.format == ImageFormat::kWebp) {
    // Lossy WebP upsamples chroma: pixels at the edge of a cropped decode
    // differ from a full decode's, so a margin is decoded and cut off.
    constexpr int64_t kMargin = 4;
    const int64_t x0 = std::max<int64_t>(0, stored.x - kMargin) & ~int64_t{1};
    const int64_t y0 = std::max<int64_t>(0, stored.y - kMargin) & ~int64_t{1};
    const int64_t x1 = std::min(size.width, stored.x + stored.width + kMargin);
    const int64_t y1 = std::min(size.height, stored.y + stored.height + kMargin);
    const PixelBox margin{x0, y0, x1 - x0, y1 - y0};
    detail::resize_scratch(out.pixels, image_bytes(margin.width, margin.height, channels));
    detail::webp_decode(bytes, options, size, margin, out.pixels);
    out.width = margin.width;
    out.height = margin.height;
    out.channels = channels;
    out.scale = 1.0;
    cut(out, {stored.x - x0, stored.y - y0, stored.width, stored.height});
  } else {
    detail::resize_scratch(out.pixels, image_bytes(size.width, size.height, channels));
    out.corrupt_data = decode_whole(bytes, info.format, size, options, out.pixels);
    out.width = size.width;
    out.height = size.height;
    out.channels = channels;
    out.scale = 1.0;
    cut(out, stored);
  }
  if (info.format != ImageFormat::kJpeg) {
    out.region_x = out.region_y = 0;
    out.region_width = static_cast<double>(out.width);
    out.region_height = static_cast<double>(out.height);
  }
  // The region's margins inside the pixels move with the orientation.
  const double left = out.region_x, top = out.region_y;
  const double right = static_cast<double>(out.width) - out.region_x - out.region_width;
  const double bottom = static_cast<double>(out.height) - out.region_y - out.region_height;
  const double margins[9][4] = {
      {left, top, right, bottom}, {left, top, right, bottom}, {right, top, left, bottom},
      {right, bottom, left, top}, {left, bottom, right, top}, {top, left, bottom, right},
      {bottom, left, top, right}, {bottom, right, top, left}, {top, right, bottom, left}};
  thread_local std::vector<uint8_t> spare;
  const detail::ScratchTrim<uint8_t, 1> trim({&spare});
  orient(out, info.orientation, spare);
  const double* m = margins[std::clamp(info.orientation, 1, 8)];
  out.region_x = m[0];
  out.region_y = m[1];
  out.region_width = static_cast<double>(out.width) - m[0] - m[2];
  out.region_height = static_cast<double>(out.height) - m[1] - m[3];
  out.region = box;
}

std::string pixel_limit_warning(const std::string& file, const ImageInfo& info,
                                uint64_t max_pixels) {
  return file + ": " + std::to_string(info.width) + "x" + std::to_string(info.height) +
         " pixels exceed max_pixels (" + std::to_string(max_pixels) +
         "), could be a decompression bomb (Pillow warns alike, and refuses twice as many); "
         "decoded. Raise max_pixels, or pass None, to silence this.";
}

std::string corrupt_jpeg_warning(const std::string& file) {
  return file +
         ": corrupt JPEG data, decoded as Pillow decodes it (libjpeg worked around it; the "
         "pixels after the damage may be grey or shifted). accept_corrupt_jpeg=False refuses "
         "such files.";
}

bool decode_image_into(std::span<const std::byte> bytes, const ImageInfo& info,
                       const DecodeOptions& options, std::span<uint8_t> dst) {
  const int channels = color_mode_channels(options.mode);
  if (dst.size() != image_bytes(info.width, info.height, channels)) {
    throw InvalidArgument("decode destination holds " + std::to_string(dst.size()) +
                          " bytes, the image needs " +
                          std::to_string(image_bytes(info.width, info.height, channels)));
  }
  if (info.orientation <= 1)
    return decode_whole(bytes, info.format, stored_size(info), options, dst);
  thread_local DecodedImage decoded;
  const detail::ScratchTrim<uint8_t, 1> trim({&decoded.pixels});
  decode_image(bytes, info, options, {}, decoded);
  std::copy(decoded.pixels.begin(), decoded.pixels.end(), dst.begin());
  return decoded.corrupt_data;
}

}  // namespace leanloader
