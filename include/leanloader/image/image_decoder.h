// Image decoding: JPEG (libjpeg-turbo), PNG (libspng), WebP (libwebp) to
// 8-bit pixels, row-major, channels interleaved.
//
// Colors follow Pillow's `Image.convert(mode)` of what Pillow opens, so that
// a pipeline moved from PIL sees the same pixels: grayscale is replicated,
// alpha is dropped (not composited), palettes are looked up, 16-bit samples
// keep their high byte (16-bit grayscale, Pillow's "I;16", is clipped to 255
// as Pillow does), CMYK/YCCK JPEGs use Pillow's CMYK -> RGB formula, gray
// from color uses Pillow's ITU-R 601-2 luma.
//
// Untrusted bytes: every size comes from a header and is checked (through
// core/checked_size.h) against DecodeOptions::max_pixels before anything is
// allocated; malformed, truncated or over-limit input throws FormatError
// with the cause. Thread-safe: no shared state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "leanloader/image/image_format.h"

namespace leanloader {

// Pillow's Image.MAX_IMAGE_PIXELS: as Pillow, an image above it is decoded
// with a warning (Pillow's DecompressionBombWarning), one above twice it is
// refused from the header (DecompressionBombError).
inline constexpr uint64_t kDefaultMaxImagePixels = 89'478'485;

enum class ColorMode {
  kRGB,   // 3 channels (Pillow's convert("RGB"))
  kGray,  // 1 channel (convert("L"))
  kRGBA,  // 4 channels (convert("RGBA")); 255 where the image has no alpha
};

int color_mode_channels(ColorMode mode) noexcept;

struct DecodeOptions {
  ColorMode mode = ColorMode::kRGB;
  // Images whose header gives more pixels (width x height) than this are
  // decoded with a warning (ImageInfo::over_pixel_limit), more than twice
  // this are refused before decoding. 0: no limit.
  uint64_t max_pixels = kDefaultMaxImagePixels;
  // libjpeg-turbo reports corrupt data it can work around (bad Huffman
  // codes, extra bytes) as warnings. true: decode on, as Pillow does (and say
  // so: DecodedImage::corrupt_data). false: each is an error. A file that
  // ends early is an error either way, as in Pillow.
  bool accept_corrupt_jpeg = true;
  // Rotate/flip by the EXIF orientation tag (JPEG APP1, PNG eXIf, WebP
  // EXIF), as Pillow's ImageOps.exif_transpose. Off by default, as in PIL and
  // torchvision.
  bool exif_orientation = false;
};

// What the header says, read without decoding pixels. width and height are
// as displayed: swapped when EXIF orientation is applied and turns the image.
struct ImageInfo {
  ImageFormat format = ImageFormat::kUnknown;
  int64_t width = 0;
  int64_t height = 0;
  // EXIF orientation 1..8 when applied (DecodeOptions::exif_orientation),
  // 1 otherwise.
  int orientation = 1;
  // More pixels than DecodeOptions::max_pixels (but not twice as many): the
  // user is warned (pixel_limit_warning), as Pillow warns.
  bool over_pixel_limit = false;
};

// A rectangle of pixels: columns [x, x + width), rows [y, y + height).
struct PixelBox {
  int64_t x = 0;
  int64_t y = 0;
  int64_t width = 0;
  int64_t height = 0;
  bool operator==(const PixelBox&) const = default;
};

// Reads the header; throws FormatError for unknown/malformed bytes and for
// an image over options.max_pixels.
ImageInfo read_image_info(std::span<const std::byte> bytes, const DecodeOptions& options);

// Which part of the (displayed) image is wanted and how small it may come.
struct DecodeRequest {
  // The region to decode, in displayed coordinates; the whole image if
  // width or height is 0. Must lie inside the image.
  PixelBox region;
  // The decoder may shrink by a factor it supports (JPEG's DCT scaling
  // n/8) as long as the decoded region stays at least this large; 0 = no
  // shrinking.
  int64_t min_width = 0;
  int64_t min_height = 0;
};

// Decoded pixels: height rows of width x channels bytes, no padding.
struct DecodedImage {
  std::vector<uint8_t> pixels;  // reused between decodes (capacity kept)
  int64_t width = 0;
  int64_t height = 0;
  int channels = 0;
  // The displayed-image region asked for, and the factor the pixels were
  // shrunk by (1 = full resolution; JPEG: n/8).
  PixelBox region;
  double scale = 1.0;
  // Where `region` lies in `pixels`, in pixels: the whole image (0, 0,
  // width, height) at full resolution; a fractional box inside a slightly
  // larger one when shrunk (the decoder widens to whole pixels).
  double region_x = 0;
  double region_y = 0;
  double region_width = 0;
  double region_height = 0;
  // JPEG: libjpeg worked around corrupt data somewhere in the file (only
  // with accept_corrupt_jpeg; the whole file is read whatever the region).
  bool corrupt_data = false;
};

// Decodes `request.region` of the image into `out`. `info` must come from
// read_image_info(bytes, options). JPEG decodes only the rows and
// iMCU-aligned columns of the region, at the smallest DCT scale allowed.
void decode_image(std::span<const std::byte> bytes, const ImageInfo& info,
                  const DecodeOptions& options, const DecodeRequest& request, DecodedImage& out);

// What the user is told of an image over max_pixels (not over twice it),
// naming `file`.
std::string pixel_limit_warning(const std::string& file, const ImageInfo& info,
                                uint64_t max_pixels);

// What the user is told of a JPEG decoded through corrupt data: the file
// (or "image bytes"), what happened and the option that refuses such files.
std::string corrupt_jpeg_warning(const std::string& file);

// Decodes the whole image at full size straight into `dst`, which must hold
// exactly width x height x channels bytes (no intermediate copy when no
// orientation change is needed). Returns DecodedImage::corrupt_data.
bool decode_image_into(std::span<const std::byte> bytes, const ImageInfo& info,
                       const DecodeOptions& options, std::span<uint8_t> dst);

}  // namespace leanloader
