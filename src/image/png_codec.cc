// PNG through libspng. Sizes come from IHDR and are limited (spng's own image
// and chunk limits as well as ours) before any pixel buffer exists.
#include <spng.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "image/codecs.h"
#include "leanloader/core/checked_size.h"
#include "leanloader/core/error.h"

namespace leanloader::detail {

namespace {

// Ancillary chunks (text, ICC, EXIF) are kept up to this size each and in
// total; image data is not a cached chunk and is limited by the pixel count.
constexpr size_t kChunkLimit = size_t{64} << 20;

struct ContextDeleter {
  void operator()(spng_ctx* ctx) const noexcept { spng_ctx_free(ctx); }
};
using Context = std::unique_ptr<spng_ctx, ContextDeleter>;

void check(int status, const char* what) {
  if (status != 0) {
    throw FormatError(std::string("PNG: ") + what + ": " + spng_strerror(status));
  }
}

Context open_png(std::span<const std::byte> bytes) {
  Context ctx(spng_ctx_new(0));
  if (!ctx) throw OutOfMemory("PNG: cannot create a decoder");
  check(spng_set_chunk_limits(ctx.get(), kChunkLimit, kChunkLimit), "chunk limits");
  check(spng_set_png_buffer(ctx.get(), bytes.data(), bytes.size()), "reading the signature");
  return ctx;
}

size_t decoded_size(spng_ctx* ctx, int format) {
  size_t size = 0;
  check(spng_decoded_image_size(ctx, format, &size), "image size");
  return size;
}

}  // namespace

StoredSize png_size(std::span<const std::byte> bytes) {
  Context ctx = open_png(bytes);
  spng_ihdr ihdr{};
  check(spng_get_ihdr(ctx.get(), &ihdr), "header");
  return {ihdr.width, ihdr.height};
}

void png_decode(std::span<const std::byte> bytes, const DecodeOptions& options, StoredSize size,
                std::span<uint8_t> dst) {
  Context ctx = open_png(bytes);
  // Limits spng checks itself, so that nothing larger than the header said
  // is ever allocated.
  check(spng_set_image_limits(ctx.get(), static_cast<uint32_t>(size.width),
                              static_cast<uint32_t>(size.height)),
        "image limits");
  spng_ihdr ihdr{};
  check(spng_get_ihdr(ctx.get(), &ihdr), "header");
  const int channels = color_mode_channels(options.mode);
  const size_t pixels = static_cast<size_t>(size.width) * static_cast<size_t>(size.height);
  if (dst.size() != pixels * static_cast<size_t>(channels)) {
    throw InvalidArgument("PNG: destination has the wrong size");
  }
  const bool gray = ihdr.color_type == SPNG_COLOR_TYPE_GRAYSCALE;

  if (gray && ihdr.bit_depth == 16) {
    // Pillow opens this as "I;16" and its conversions to L, RGB and RGBA
    // clip at 255 (they do not scale); RGBA is opaque.
    std::vector<uint16_t> wide(pixels);
    check(spng_decode_image(ctx.get(), wide.data(), decoded_size(ctx.get(), SPNG_FMT_PNG),
                            SPNG_FMT_PNG, 0),
          "decoding");
    const int colors = std::min(channels, 3);
    for (size_t i = 0; i < pixels; ++i) {
      const auto value = static_cast<uint8_t>(std::min<uint16_t>(wide[i], 255));
      uint8_t* pixel = dst.data() + i * static_cast<size_t>(channels);
      for (int c = 0; c < colors; ++c) pixel[c] = value;
      if (channels == 4) pixel[3] = 255;
    }
    return;
  }
  if (channels == 4) {
    check(spng_decode_image(ctx.get(), dst.data(), dst.size(), SPNG_FMT_RGBA8, SPNG_DECODE_TRNS),
          "decoding");
    return;
  }
  if (channels == 3) {
    check(spng_decode_image(ctx.get(), dst.data(), dst.size(), SPNG_FMT_RGB8, 0), "decoding");
    return;
  }
  // Gray output.
  if (gray && ihdr.bit_depth <= 8) {
    check(spng_decode_image(ctx.get(), dst.data(), dst.size(), SPNG_FMT_G8, 0), "decoding");
    return;
  }
  // Gray + alpha and color: RGB, then Pillow's luma (exact for gray: the
  // weights sum to 1).
  std::vector<uint8_t> rgb(pixels * 3);
  check(spng_decode_image(ctx.get(), rgb.data(), rgb.size(), SPNG_FMT_RGB8, 0), "decoding");
  rgb_to_gray_in_place(rgb.data(), pixels);
  std::memcpy(dst.data(), rgb.data(), pixels);
}

}  // namespace leanloader::detail
