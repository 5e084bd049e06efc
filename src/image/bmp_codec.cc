// BMP as Pillow's BmpImagePlugin reads it: the OS/2 (12-byte) and Windows
// (40 to 124-byte) headers, 1/4/8-bit palettes (BGR or BGRX entries), 16-bit
// 5-5-5 and 5-6-5 (Pillow's BGR;15 / BGR;16 unpackers: c * 255 / max, integer
// division), 24-bit, 32-bit BGRX (alpha ignored, as Pillow) or the bitfield
// layouts Pillow knows (with alpha: mode RGBA), RLE8 and RLE4 through
// Pillow's own decoding loop (its quirks included: an absolute run is padded
// to an even file offset, a stream that ends before the last row is refused),
// bottom-up or top-down rows. What Pillow refuses (2-bit pixels, other
// bitfields, JPEG/PNG payloads, a short file) is refused.
//
// Why our own reader: the rules are Pillow's, not a library's (stb_image and
// OpenCV expand 5-bit channels by bit replication, which differs from
// Pillow's by one in some values, and stb_image has no RLE).
#include <array>
#include <cstring>
#include <string>
#include <vector>

#include "image/byte_order.h"
#include "image/codecs.h"
#include "image/pillow_pixels.h"
#include "leanloader/core/checked_size.h"
#include "leanloader/core/error.h"

namespace leanloader::detail {

namespace {

uint32_t u32(std::span<const std::byte> b, size_t at) {
  if (at + 4 > b.size()) throw FormatError("BMP: the header is truncated");
  return load_u32(b.data() + at, false);
}

uint32_t u16(std::span<const std::byte> b, size_t at) {
  if (at + 2 > b.size()) throw FormatError("BMP: the header is truncated");
  return load_u16(b.data() + at, false);
}

constexpr uint32_t kRaw = 0, kRle8 = 1, kRle4 = 2, kBitfields = 3;

// How each pixel's bytes become RGBA.
enum class Unpack { kIndex1, kIndex4, kIndex8, kBgr15, kBgr16, kBgr, kMasks32 };

struct BmpHeader {
  int64_t width = 0;
  int64_t height = 0;
  bool top_down = false;
  uint32_t bits = 0;
  uint32_t compression = kRaw;
  Unpack unpack = Unpack::kBgr;
  std::array<uint32_t, 4> masks{};       // R, G, B, A for kMasks32
  std::array<uint32_t, 4> file_masks{};  // as the header gives them (BITFIELDS)
  bool alpha = false;                    // Pillow's mode RGBA
  std::vector<std::array<uint8_t, 3>> palette;
  size_t data_offset = 0;
};

BmpHeader parse_header(std::span<const std::byte> bytes) {
  if (bytes.size() < 14 || bytes[0] != std::byte{'B'} || bytes[1] != std::byte{'M'}) {
    throw FormatError("BMP: not a BMP file");
  }
  BmpHeader h;
  size_t offset = u32(bytes, 10);
  const uint32_t header_size = u32(bytes, 14);
  const size_t info = 18;  // header_data in Pillow: after the size field
  uint32_t colors = 0;
  size_t palette_padding = 4;
  size_t after_header = 14 + static_cast<size_t>(header_size);
  if (header_size == 12) {
    h.width = u16(bytes, info);
    h.height = u16(bytes, info + 2);
    h.bits = u16(bytes, info + 6);
    palette_padding = 3;
  } else if (header_size == 40 || header_size == 52 || header_size == 56 || header_size == 64 ||
             header_size == 108 || header_size == 124) {
    const uint32_t raw_height = u32(bytes, info + 4);
    h.top_down = (raw_height >> 24) == 0xFF;
    h.width = u32(bytes, info);
    h.height = h.top_down ? (int64_t{1} << 32) - raw_height : raw_height;
    h.bits = u16(bytes, info + 10);
    h.compression = u32(bytes, info + 12);
    colors = u32(bytes, info + 28);
    if (h.compression == kBitfields) {
      if (header_size - 4 >= 48) {
        for (size_t i = 0; i < (header_size - 4 >= 52 ? 4u : 3u); ++i) {
          h.file_masks[i] = u32(bytes, info + 36 + i * 4);
        }
      } else {  // three masks after a 40-byte header
        for (size_t i = 0; i < 3; ++i) h.file_masks[i] = u32(bytes, after_header + i * 4);
        after_header += 12;
      }
    }
  } else {
    throw FormatError("BMP: unsupported header type (" + std::to_string(header_size) + ")");
  }
  if (colors == 0 && h.bits < 32) colors = 1u << h.bits;
  if (offset == 14 + header_size && h.bits <= 8) offset += palette_padding * colors;

  switch (h.bits) {
    case 1:
      h.unpack = Unpack::kIndex1;
      break;
    case 4:
      h.unpack = Unpack::kIndex4;
      break;
    case 8:
      h.unpack = Unpack::kIndex8;
      break;
    case 16:
      h.unpack = Unpack::kBgr15;
      break;
    case 24:
      h.unpack = Unpack::kBgr;
      break;
    case 32:
      h.unpack = Unpack::kMasks32;
      h.masks = {0xFF0000, 0xFF00, 0xFF, 0};  // BGRX: alpha ignored, as Pillow
      break;
    default:
      throw FormatError("BMP: unsupported pixel depth (" + std::to_string(h.bits) + ")");
  }
  if (h.compression == kBitfields) {
    const std::array<uint32_t, 4> m = h.file_masks;
    const std::array<uint32_t, 3> rgb{m[0], m[1], m[2]};
    if (h.bits == 32) {
      static constexpr std::array<std::array<uint32_t, 4>, 8> kKnown{{
          {0xFF0000, 0xFF00, 0xFF, 0x0},
          {0xFF000000, 0xFF0000, 0xFF00, 0x0},
          {0xFF000000, 0xFF00, 0xFF, 0x0},
          {0xFF000000, 0xFF0000, 0xFF00, 0xFF},
          {0xFF, 0xFF00, 0xFF0000, 0xFF000000},
          {0xFF0000, 0xFF00, 0xFF, 0xFF000000},
          {0xFF000000, 0xFF00, 0xFF, 0xFF0000},
          {0x0, 0x0, 0x0, 0x0},
      }};
      bool known = false;
      for (const auto& k : kKnown) known = known || k == m;
      if (!known) throw FormatError("BMP: unsupported bitfields layout");
      // All zero: Pillow reads the pixels as BGRA.
      h.masks = m == std::array<uint32_t, 4>{}
                    ? std::array<uint32_t, 4>{0xFF0000, 0xFF00, 0xFF, 0xFF000000}
                    : m;
      h.alpha = h.masks[3] != 0;
    } else if (h.bits == 24 && rgb == std::array<uint32_t, 3>{0xFF0000, 0xFF00, 0xFF}) {
      h.unpack = Unpack::kBgr;
    } else if (h.bits == 16 && rgb == std::array<uint32_t, 3>{0xF800, 0x7E0, 0x1F}) {
      h.unpack = Unpack::kBgr16;
    } else if (h.bits == 16 && rgb == std::array<uint32_t, 3>{0x7C00, 0x3E0, 0x1F}) {
      h.unpack = Unpack::kBgr15;
    } else {
      throw FormatError("BMP: unsupported bitfields layout");
    }
  } else if (h.compression == kRle8 || h.compression == kRle4) {
    if (h.bits != (h.compression == kRle8 ? 8u : 4u)) {
      throw FormatError("BMP: RLE compression with " + std::to_string(h.bits) + "-bit pixels");
    }
  } else if (h.compression != kRaw) {
    throw FormatError("BMP: unsupported compression (" + std::to_string(h.compression) + ")");
  }
  if (h.bits <= 8) {
    if (colors == 0 || colors > 65536) {
      throw FormatError("BMP: unsupported palette size (" + std::to_string(colors) + ")");
    }
    if (colors > 256) {
      // Pillow accepts the header, then its putpalette refuses more than 256
      // entries at load.
      throw FormatError("BMP: invalid palette size (" + std::to_string(colors) +
                        " colours; at most 256)");
    }
    // Pillow reads the palette right after the header (and the masks).
    const size_t entries = std::min<size_t>(colors, 256);
    h.palette.assign(256, {0, 0, 0});
    for (size_t i = 0; i < entries; ++i) {
      const size_t at = after_header + i * palette_padding;
      if (at + 3 > bytes.size()) break;  // a short palette: Pillow reads what is there
      h.palette[i] = {static_cast<uint8_t>(bytes[at + 2]), static_cast<uint8_t>(bytes[at + 1]),
                      static_cast<uint8_t>(bytes[at])};
    }
  }
  h.data_offset = offset;
  return h;
}

[[noreturn]] void truncated() {
  throw FormatError("BMP: image file is truncated (not enough image data)");
}

// Pillow's BmpRleDecoder: palette indices, rows in file order (bottom-up
// unless top-down), refused when the stream ends before filling the image.
std::vector<uint8_t> decode_rle(std::span<const std::byte> bytes, const BmpHeader& h) {
  const auto width = static_cast<size_t>(h.width);
  const auto total = checked_mul(width, static_cast<size_t>(h.height));
  if (!total) throw FormatError("BMP: image size overflows");
  const bool rle4 = h.compression == kRle4;
  std::vector<uint8_t> data;
  data.reserve(*total);
  size_t at = h.data_offset;
  size_t x = 0;
  const auto read = [&]() -> int { return at < bytes.size() ? static_cast<int>(bytes[at++]) : -1; };
  while (data.size() < *total) {
    const int count = read();
    const int byte = read();
    if (count < 0 || byte < 0) break;
    if (count > 0) {
      size_t pixels = static_cast<size_t>(count);
      if (x + pixels > width) pixels = x < width ? width - x : 0;
      for (size_t i = 0; i < pixels; ++i) {
        data.push_back(rle4 ? static_cast<uint8_t>(i % 2 == 0 ? byte >> 4 : byte & 0x0F)
                            : static_cast<uint8_t>(byte));
      }
      x += pixels;
    } else if (byte == 0) {  // end of line
      while (data.size() % width != 0) data.push_back(0);
      x = 0;
    } else if (byte == 1) {  // end of bitmap
      break;
    } else if (byte == 2) {  // delta
      const int right = read();
      const int up = read();
      if (right < 0 || up < 0) break;
      const size_t skip = std::min(*total - data.size(),
                                   static_cast<size_t>(right) + static_cast<size_t>(up) * width);
      data.insert(data.end(), skip, 0);
      x = data.size() % width;
    } else {  // an absolute run of `byte` pixels
      const size_t data_count = std::min(*total - data.size(), static_cast<size_t>(byte));
      const size_t byte_count = rle4 ? (data_count + 1) / 2 : data_count;
      const size_t available = std::min(byte_count, bytes.size() - std::min(at, bytes.size()));
      for (size_t i = 0; i < available; ++i) {
        const auto value = static_cast<uint8_t>(bytes[at + i]);
        if (rle4) {
          data.push_back(value >> 4);
          if (i * 2 + 1 < data_count) data.push_back(value & 0x0F);
        } else {
          data.push_back(value);
        }
      }
      at += available;
      if (available < byte_count || data.size() == *total) break;
      x += static_cast<size_t>(byte);
      if (at % 2 != 0) ++at;  // runs end on a 16-bit boundary of the file
    }
  }
  if (data.size() < *total) truncated();
  return data;
}

}  // namespace

StoredSize bmp_size(std::span<const std::byte> bytes) {
  const BmpHeader h = parse_header(bytes);
  return {h.width, h.height};
}

void bmp_decode(std::span<const std::byte> bytes, const DecodeOptions& options, StoredSize size,
                std::span<uint8_t> dst) {
  const BmpHeader h = parse_header(bytes);
  const int channels = color_mode_channels(options.mode);
  const auto width = static_cast<size_t>(size.width);
  const auto height = static_cast<size_t>(size.height);
  const size_t pixels = width * height;
  if (dst.size() != pixels * static_cast<size_t>(channels)) {
    throw InvalidArgument("BMP: destination has the wrong size");
  }
  std::vector<uint8_t> rle;
  size_t stride = 0;
  const uint8_t* rows = nullptr;
  if (h.compression == kRle8 || h.compression == kRle4) {
    rle = decode_rle(bytes, h);
    stride = width;
    rows = rle.data();
  } else {
    const auto row_bits = checked_mul(width, h.bits);
    if (!row_bits) throw FormatError("BMP: image size overflows");
    stride = ((*row_bits + 31) >> 3) & ~size_t{3};
    // The last row stored needs no padding (Pillow's raw decoder reads a row's
    // pixels, then skips the padding).
    const auto padded = checked_mul(stride, height > 0 ? height - 1 : 0);
    const auto total = padded ? checked_add(*padded, (*row_bits + 7) / 8) : std::nullopt;
    if (!total) throw FormatError("BMP: image size overflows");
    if (h.data_offset > bytes.size() || bytes.size() - h.data_offset < *total) truncated();
    rows = reinterpret_cast<const uint8_t*>(bytes.data()) + h.data_offset;
  }
  const bool indices_in_bytes = !rle.empty();  // RLE gives one index per byte
  // Colour first; gray output is Pillow's luma of it (exact for gray palettes).
  for (size_t y = 0; y < height; ++y) {
    const uint8_t* row = rows + (h.top_down ? y : height - 1 - y) * stride;
    for (size_t x = 0; x < width; ++x) {
      uint8_t r = 0, g = 0, b = 0, a = 255;
      switch (indices_in_bytes ? Unpack::kIndex8 : h.unpack) {
        case Unpack::kIndex1:
        case Unpack::kIndex4:
        case Unpack::kIndex8: {
          uint32_t index;
          if (indices_in_bytes || h.unpack == Unpack::kIndex8) {
            index = row[x];
          } else if (h.unpack == Unpack::kIndex1) {
            index = (row[x / 8] >> (7 - x % 8)) & 1;
          } else {
            index = x % 2 == 0 ? row[x / 2] >> 4 : row[x / 2] & 0x0F;
          }
          const auto& entry = h.palette[index];
          r = entry[0], g = entry[1], b = entry[2];
          break;
        }
        case Unpack::kBgr15:
        case Unpack::kBgr16: {
          const uint32_t p = row[2 * x] | uint32_t{row[2 * x + 1]} << 8;
          if (h.unpack == Unpack::kBgr15) {
            r = static_cast<uint8_t>(((p >> 10) & 31) * 255 / 31);
            g = static_cast<uint8_t>(((p >> 5) & 31) * 255 / 31);
          } else {
            r = static_cast<uint8_t>(((p >> 11) & 31) * 255 / 31);
            g = static_cast<uint8_t>(((p >> 5) & 63) * 255 / 63);
          }
          b = static_cast<uint8_t>((p & 31) * 255 / 31);
          break;
        }
        case Unpack::kBgr:
          b = row[3 * x], g = row[3 * x + 1], r = row[3 * x + 2];
          break;
        case Unpack::kMasks32: {
          uint32_t p;
          std::memcpy(&p, row + 4 * x, 4);  // little-endian file, little-endian host
          const auto channel = [p](uint32_t mask) {
            if (mask == 0) return uint8_t{255};
            return static_cast<uint8_t>((p & mask) >> __builtin_ctz(mask));
          };
          r = channel(h.masks[0]), g = channel(h.masks[1]), b = channel(h.masks[2]);
          if (h.alpha) a = channel(h.masks[3]);
          break;
        }
      }
      put_pixel(dst.data() + (y * width + x) * static_cast<size_t>(channels), channels, r, g, b, a);
    }
  }
}

}  // namespace leanloader::detail
