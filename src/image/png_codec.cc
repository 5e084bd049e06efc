// PNG through libspng. Sizes come from IHDR and are limited (spng's own image
// and chunk limits as well as ours) before any pixel buffer exists.
#include <libdeflate.h>
#include <spng.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "image/byte_order.h"
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

// Pillow's chunk name rule (a regex \w{4}).
bool is_chunk_name(const std::byte* at) {
  return std::all_of(at, at + 4, [](std::byte b) {
    const auto c = static_cast<unsigned char>(b);
    return std::isalnum(c) != 0 || c == '_';
  });
}

std::string chunk_name(const std::byte* at) {
  return std::string(reinterpret_cast<const char*>(at), 4);
}

// The chunk structure as Pillow's PngImagePlugin walks it, so that a file is
// refused where Pillow refuses it even when libspng, which stops reading at
// the last row, decodes it:
// - up to the first IDAT (Image.open), every chunk complete with a correct
//   CRC, and an iCCP profile compressed by method 0;
// - after the image data (load_end), every chunk with a readable header is
//   complete up to IEND (its CRC is not read there);
// - an APNG's frame control before the image data is for the whole image.
void check_chunks_as_pillow(std::span<const std::byte> bytes) {
  size_t at = 8;
  uint32_t image_width = 0, image_height = 0;
  const auto header_at = [&](size_t offset) { return offset + 8 <= bytes.size(); };
  for (;;) {
    if (!header_at(at) || !is_chunk_name(bytes.data() + at + 4)) {
      throw FormatError("PNG: broken file: no readable chunk at byte " + std::to_string(at) +
                        " before the image data");
    }
    const uint32_t length = load_u32(bytes.data() + at, true);
    const std::string name = chunk_name(bytes.data() + at + 4);
    if (name == "IDAT" || name == "fdAT") break;
    if (bytes.size() - at - 8 < static_cast<size_t>(length) + 4) {
      throw FormatError("PNG: image file is truncated (in the " + name + " chunk)");
    }
    const std::byte* data = bytes.data() + at + 8;
    const uint32_t crc = libdeflate_crc32(0, bytes.data() + at + 4, size_t{length} + 4);
    if (crc != load_u32(data + length, true)) {
      throw FormatError("PNG: broken file (bad checksum in the " + name + " chunk)");
    }
    if (name == "IHDR" && length >= 8) {
      image_width = load_u32(data, true);
      image_height = load_u32(data + 4, true);
    }
    if (name == "fcTL" && length >= 26) {
      // An APNG frame control before the image data makes that data the
      // first frame: Pillow decodes it as a frame of that size at that place
      // (and fails when it holds the whole image), where libspng reads the
      // whole image. The APNG rule is a frame of the whole image at (0, 0).
      const uint32_t width = load_u32(data + 4, true), height = load_u32(data + 8, true);
      const uint32_t x = load_u32(data + 12, true), y = load_u32(data + 16, true);
      if (width != image_width || height != image_height || x != 0 || y != 0) {
        throw FormatError("PNG: the APNG frame control before the image data is for a " +
                          std::to_string(width) + "x" + std::to_string(height) + " frame at (" +
                          std::to_string(x) + ", " + std::to_string(y) + "), not the whole " +
                          std::to_string(image_width) + "x" + std::to_string(image_height) +
                          " image");
      }
    }
    if (name == "iCCP") {
      const auto* end = std::find(data, data + length, std::byte{0});
      if (end + 1 < data + length && *(end + 1) != std::byte{0}) {
        throw FormatError("PNG: unknown compression method " +
                          std::to_string(static_cast<int>(*(end + 1))) + " in the iCCP chunk");
      }
    }
    at += size_t{length} + 12;
  }
  // The image data: consecutive IDAT (or fdAT) chunks; libspng reads them.
  while (header_at(at)) {
    const std::string name = chunk_name(bytes.data() + at + 4);
    if (name != "IDAT" && name != "fdAT") break;
    const size_t length = load_u32(bytes.data() + at, true);
    const size_t available = bytes.size() - at - 8;
    if (available < length) {
      // Cut inside this chunk's data: Pillow accepts the file when its
      // decoder finished inside this chunk (libspng decides that), but a chunk
      // with no data at all came after the image's last byte.
      if (available == 0) {
        throw FormatError("PNG: image file is truncated (an " + name +
                          " chunk after the image data is cut short)");
      }
      return;
    }
    at += length + 12;
  }
  while (header_at(at) && is_chunk_name(bytes.data() + at + 4)) {
    const std::string name = chunk_name(bytes.data() + at + 4);
    if (name == "IEND") return;
    const size_t length = load_u32(bytes.data() + at, true);
    if (bytes.size() - at - 8 < length) {
      throw FormatError("PNG: image file is truncated (the " + name +
                        " chunk after the image data is cut short)");
    }
    at += length + 12;
  }
}

// A colour key (tRNS of a gray or truecolor PNG) as Pillow applies it in
// convert("RGBA"): to the 8-bit pixels Pillow holds (low gray depths scaled
// up, 16-bit samples clipped (gray) or cut to their high byte (color)),
// compared with the key's low byte, except 1-bit gray, whose key is on or
// off. Not the PNG rule (the key in the sample's own depth), which libspng
// follows: 2-bit gray keyed 1 is transparent there, opaque in Pillow.
struct PillowColorKey {
  bool present = false;
  bool one_bit = false;
  bool on = false;  // 1-bit gray: the key is non-zero
  uint8_t red = 0, green = 0, blue = 0;

  static PillowColorKey of(spng_ctx* ctx, const spng_ihdr& ihdr) {
    PillowColorKey key;
    spng_trns trns{};
    const bool keyed = ihdr.color_type == SPNG_COLOR_TYPE_GRAYSCALE ||
                       ihdr.color_type == SPNG_COLOR_TYPE_TRUECOLOR;
    if (!keyed || spng_get_trns(ctx, &trns) != 0) return key;
    key.present = true;
    if (ihdr.color_type == SPNG_COLOR_TYPE_GRAYSCALE) {
      key.one_bit = ihdr.bit_depth == 1;
      key.on = trns.gray != 0;
      key.red = key.green = key.blue = static_cast<uint8_t>(trns.gray & 0xFF);
    } else {
      key.red = static_cast<uint8_t>(trns.red & 0xFF);
      key.green = static_cast<uint8_t>(trns.green & 0xFF);
      key.blue = static_cast<uint8_t>(trns.blue & 0xFF);
    }
    return key;
  }
  // The alpha of a pixel whose 8-bit color Pillow holds is (r, g, b).
  uint8_t alpha(uint8_t r, uint8_t g, uint8_t b) const noexcept {
    const bool keyed = one_bit ? (r != 0) == on : r == red && g == green && b == blue;
    return keyed ? 0 : 255;
  }
};

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
  check_chunks_as_pillow(bytes);
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
    // clip at 255 (they do not scale); RGBA is opaque but for a colour key.
    std::vector<uint16_t> wide(pixels);
    check(spng_decode_image(ctx.get(), wide.data(), decoded_size(ctx.get(), SPNG_FMT_PNG),
                            SPNG_FMT_PNG, 0),
          "decoding");
    const PillowColorKey key = PillowColorKey::of(ctx.get(), ihdr);
    const int colors = std::min(channels, 3);
    for (size_t i = 0; i < pixels; ++i) {
      const auto value = static_cast<uint8_t>(std::min<uint16_t>(wide[i], 255));
      uint8_t* pixel = dst.data() + i * static_cast<size_t>(channels);
      for (int c = 0; c < colors; ++c) pixel[c] = value;
      if (channels == 4) pixel[3] = key.present ? key.alpha(value, value, value) : 255;
    }
    return;
  }
  if (channels == 4) {
    const PillowColorKey key = PillowColorKey::of(ctx.get(), ihdr);
    if (!key.present) {
      // Palette transparency and alpha channels: libspng's and Pillow's agree.
      check(spng_decode_image(ctx.get(), dst.data(), dst.size(), SPNG_FMT_RGBA8, SPNG_DECODE_TRNS),
            "decoding");
      return;
    }
    // 8-bit color as Pillow holds it (16-bit samples to their high byte,
    // low gray depths scaled up), alpha from the key as Pillow compares it.
    check(spng_decode_image(ctx.get(), dst.data(), dst.size(), SPNG_FMT_RGBA8, 0), "decoding");
    for (size_t i = 0; i < pixels; ++i) {
      uint8_t* pixel = dst.data() + i * 4;
      pixel[3] = key.alpha(pixel[0], pixel[1], pixel[2]);
    }
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
