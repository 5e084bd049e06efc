// The codec entry points behind image_decoder.h. Internal.
//
// Coordinates here are the image as stored (before EXIF orientation). Each
// decoder writes `channels` (1, 3 or 4, see ColorMode) interleaved 8-bit
// samples per pixel, rows without padding, and throws FormatError with the
// library's message for bad bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "leanloader/image/image_decoder.h"

namespace leanloader::detail {

struct StoredSize {
  int64_t width = 0;
  int64_t height = 0;
};

// Header sizes. Throw FormatError for malformed headers.
StoredSize jpeg_size(std::span<const std::byte> bytes);
StoredSize png_size(std::span<const std::byte> bytes);
StoredSize webp_size(std::span<const std::byte> bytes);
StoredSize pnm_size(std::span<const std::byte> bytes);
StoredSize tiff_size(std::span<const std::byte> bytes);
StoredSize bmp_size(std::span<const std::byte> bytes);
StoredSize gif_size(std::span<const std::byte> bytes);

// JPEG: decodes `box` (stored coordinates) at DCT scale num/8, num the
// smallest in 1..8 that keeps the box at least min_width x min_height (1
// when both are 0). With `dst` (exactly the whole image's bytes at scale 1)
// the whole image is decoded there; otherwise into out.pixels, and
// out.width/height/channels/scale describe the result and out.region_* the
// exact box inside it (stored orientation).
void jpeg_decode(std::span<const std::byte> bytes, const DecodeOptions& options,
                 const PixelBox& box, int64_t min_width, int64_t min_height, DecodedImage& out,
                 std::span<uint8_t> dst);

// PNG decodes the whole image into `dst` (width x height x channels bytes).
void png_decode(std::span<const std::byte> bytes, const DecodeOptions& options, StoredSize size,
                std::span<uint8_t> dst);
// WebP decodes `box` of the image (cropped by libwebp) into `dst` (box
// width x height x channels bytes).
void webp_decode(std::span<const std::byte> bytes, const DecodeOptions& options, StoredSize size,
                 const PixelBox& box, std::span<uint8_t> dst);

void bmp_decode(std::span<const std::byte> bytes, const DecodeOptions& options, StoredSize size,
                std::span<uint8_t> dst);
// PBM/PGM/PPM, TIFF and BMP decode the whole image into `dst` (width x height x
// channels bytes), as Pillow decodes and converts them.
// GIF decodes the first frame on its canvas (see gif_codec.cc).
void gif_decode(std::span<const std::byte> bytes, const DecodeOptions& options, StoredSize size,
                std::span<uint8_t> dst);
void pnm_decode(std::span<const std::byte> bytes, const DecodeOptions& options, StoredSize size,
                std::span<uint8_t> dst);
void tiff_decode(std::span<const std::byte> bytes, const DecodeOptions& options, StoredSize size,
                 std::span<uint8_t> dst);

// The EXIF orientation (1..8) in the image's metadata, nullopt when absent
// or malformed (as Pillow, a bad EXIF block is no orientation).
std::optional<int> exif_orientation(std::span<const std::byte> bytes, ImageFormat format);
// The orientation tag of a TIFF-structured EXIF payload ("II*\0" / "MM\0*").
std::optional<int> tiff_orientation(std::span<const std::byte> tiff);

// Pillow's RGB -> L (ITU-R 601-2 luma, fixed point): in place, `pixels`
// RGB triplets become single bytes at the front.
void rgb_to_gray_in_place(uint8_t* pixels, size_t count);

}  // namespace leanloader::detail
