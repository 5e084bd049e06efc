// GIF (GIF87a/GIF89a) as Pillow opens it: the first frame only, on a canvas
// of the logical screen's size (grown to hold the frame when it reaches past
// it), filled outside the frame with the frame's transparent index, or 0.
// The frame is paletted ("P") when its palette (the local one when the frame
// has one, the global one otherwise) is not the identity gray ramp, gray
// ("L": the index is the value) otherwise; indices past the palette's
// entries are black. Pillow's quirk kept: a frame whose local palette is the
// ramp is "L", yet its RGB/RGBA colours are the global palette's (when that
// is not the ramp) while convert("L") gives the indices. With transparency,
// RGBA output has alpha 0 at the transparent index (convert("RGBA")).
//
// Why our own reader: these are Pillow's rules, not a library's. giflib
// refuses streams Pillow reads (an LZW minimum code size above 8, bytes
// between blocks that Pillow skips) and knows nothing of Pillow's canvas,
// gray-palette and ramp rules; the LZW decoding below keeps Pillow's
// GifDecode.c checks (a code past the next free entry, a first code after a
// clear above it, a data sub-block cut short by the end of the file).
#include <array>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "image/byte_order.h"
#include "image/codecs.h"
#include "image/pillow_pixels.h"
#include "leanloader/core/checked_size.h"
#include "leanloader/core/error.h"

namespace leanloader::detail {

namespace {

[[noreturn]] void gif_truncated() {
  throw FormatError("GIF: image file is truncated (not enough image data)");
}

struct ColorTable {
  size_t entries = 0;
  size_t at = 0;  // offset of the table's bytes
};

using Palette = std::array<std::array<uint8_t, 3>, 256>;

Palette gray_ramp() {
  Palette ramp{};
  for (size_t i = 0; i < 256; ++i) {
    const auto v = static_cast<uint8_t>(i);
    ramp[i] = {v, v, v};
  }
  return ramp;
}

// The colours of `table`'s entries, black past them (as Pillow's palette).
Palette read_palette(std::span<const std::byte> bytes, const ColorTable& table) {
  Palette palette{};
  for (size_t i = 0; i < table.entries; ++i) {
    for (size_t c = 0; c < 3; ++c) {
      palette[i][c] = static_cast<uint8_t>(bytes[table.at + 3 * i + c]);
    }
  }
  return palette;
}

struct GifFrame {
  int64_t canvas_width = 0;
  int64_t canvas_height = 0;
  int64_t x = 0, y = 0, width = 0, height = 0;
  bool interlaced = false;
  std::optional<uint8_t> transparency;
  bool paletted = false;         // Pillow's "P"; "L" otherwise
  bool gray_coloured = false;    // "L", its colours the global palette's (the quirk)
  Palette colors = gray_ramp();  // what RGB/RGBA output looks the indices up in
  int min_code_size = 0;
  size_t data_at = 0;  // the first data sub-block's length byte
};

class Cursor {
 public:
  explicit Cursor(std::span<const std::byte> bytes) : bytes_(bytes) {}
  size_t at() const { return at_; }
  bool done() const { return at_ >= bytes_.size(); }
  uint8_t byte() {
    if (done()) gif_truncated();
    return static_cast<uint8_t>(bytes_[at_++]);
  }
  uint32_t u16() {
    if (bytes_.size() - at_ < 2) gif_truncated();
    const uint32_t value = load_u16(bytes_.data() + at_, false);
    at_ += 2;
    return value;
  }
  void skip(size_t count) {
    if (bytes_.size() - at_ < count) gif_truncated();
    at_ += count;
  }
  // A data sub-block: its length byte, then its bytes; empty for the
  // terminator. Pillow's data(): a block cut short is what is there.
  std::span<const std::byte> sub_block() {
    const size_t length = byte();
    const size_t available = std::min(length, bytes_.size() - at_);
    const auto block = bytes_.subspan(at_, available);
    at_ += available;
    return block;
  }

 private:
  std::span<const std::byte> bytes_;
  size_t at_ = 0;
};

ColorTable read_color_table(Cursor& cursor, uint8_t flags) {
  ColorTable table{size_t{1} << ((flags & 7) + 1), cursor.at()};
  cursor.skip(table.entries * 3);
  return table;
}

// Pillow's _is_palette_needed: false when every entry is (i, i, i).
bool palette_needed(std::span<const std::byte> bytes, const ColorTable& table) {
  for (size_t i = 0; i < table.entries; ++i) {
    for (size_t c = 0; c < 3; ++c) {
      if (static_cast<size_t>(bytes[table.at + 3 * i + c]) != i) return true;
    }
  }
  return false;
}

// The header, the extensions before the first image and its descriptor, as
// Pillow's GifImageFile._open and _seek(0) read them.
GifFrame read_first_frame(std::span<const std::byte> bytes) {
  Cursor cursor(bytes);
  if (bytes.size() < 13 || (std::memcmp(bytes.data(), "GIF87a", 6) != 0 &&
                            std::memcmp(bytes.data(), "GIF89a", 6) != 0)) {
    throw FormatError("GIF: not a GIF file");
  }
  cursor.skip(6);
  GifFrame frame;
  frame.canvas_width = cursor.u16();
  frame.canvas_height = cursor.u16();
  const uint8_t screen_flags = cursor.byte();
  cursor.skip(2);  // background colour, aspect ratio
  std::optional<ColorTable> global;
  if (screen_flags & 0x80) {
    const ColorTable table = read_color_table(cursor, screen_flags);
    if (palette_needed(bytes, table)) global = table;
  }
  while (true) {
    if (cursor.done()) throw FormatError("GIF: no image in the file");
    const uint8_t introducer = cursor.byte();
    if (introducer == ';') throw FormatError("GIF: no image in the file");
    if (introducer == '!') {
      const uint8_t label = cursor.byte();
      const std::span<const std::byte> block = cursor.sub_block();
      if (label == 0xF9 && !block.empty()) {  // graphic control
        if (block.size() < 3) throw FormatError("GIF: graphic control extension too short");
        if (static_cast<uint8_t>(block[0]) & 1) {
          if (block.size() < 4) throw FormatError("GIF: graphic control extension too short");
          frame.transparency = static_cast<uint8_t>(block[3]);
        }
      }
      // Pillow's skipping, quirks kept: a comment's blocks end at the first
      // empty one; any other extension's reading goes on past its first block
      // even when that was the terminator (and past NETSCAPE2.0's second).
      if (label == 0xFE) {
        if (!block.empty()) {
          while (!cursor.sub_block().empty()) {
          }
        }
        continue;
      }
      static constexpr std::string_view kNetscape = "NETSCAPE2.0";
      if (label == 0xFF && block.size() >= kNetscape.size() &&
          std::memcmp(block.data(), kNetscape.data(), kNetscape.size()) == 0) {
        cursor.sub_block();
      }
      while (!cursor.sub_block().empty()) {
      }
      continue;
    }
    if (introducer != ',') continue;  // Pillow skips bytes between blocks
    frame.x = cursor.u16();
    frame.y = cursor.u16();
    frame.width = cursor.u16();
    frame.height = cursor.u16();
    const uint8_t flags = cursor.byte();
    frame.interlaced = (flags & 0x40) != 0;
    if (flags & 0x80) {
      const ColorTable local = read_color_table(cursor, flags);
      if (palette_needed(bytes, local)) {
        frame.paletted = true;
        frame.colors = read_palette(bytes, local);
      } else if (global) {
        frame.gray_coloured = true;
        frame.colors = read_palette(bytes, *global);
      }
    } else if (global) {
      frame.paletted = true;
      frame.colors = read_palette(bytes, *global);
    }
    frame.min_code_size = cursor.byte();
    frame.data_at = cursor.at();
    break;
  }
  frame.canvas_width = std::max(frame.canvas_width, frame.x + frame.width);
  frame.canvas_height = std::max(frame.canvas_height, frame.y + frame.height);
  return frame;
}

// Pillow's GifDecode.c: LZW codes from the data sub-blocks into `indices`
// (frame width x height, rows in display order); refused when the stream is
// broken or ends before the last pixel.
void decode_indices(std::span<const std::byte> bytes, const GifFrame& frame,
                    std::span<uint8_t> indices) {
  constexpr int kMaxCodeSize = 12;
  constexpr size_t kTableSize = size_t{1} << kMaxCodeSize;
  if (frame.min_code_size > kMaxCodeSize) {
    throw FormatError("GIF: LZW code size " + std::to_string(frame.min_code_size) +
                      " (at most 12)");
  }
  const auto width = static_cast<size_t>(frame.width);
  const auto height = static_cast<size_t>(frame.height);
  if (width == 0 || height == 0) throw FormatError("GIF: the first frame is empty");
  // Interlaced rows: passes starting at 0, 4, 2, 1 with steps 8, 8, 4, 2.
  std::vector<size_t> row_order;
  row_order.reserve(height);
  if (frame.interlaced) {
    constexpr std::array<std::pair<size_t, size_t>, 4> kPasses{{{0, 8}, {4, 8}, {2, 4}, {1, 2}}};
    for (const auto& [start, step] : kPasses) {
      for (size_t y = start; y < height; y += step) row_order.push_back(y);
    }
  } else {
    for (size_t y = 0; y < height; ++y) row_order.push_back(y);
  }
  size_t row = 0, x = 0;
  const auto put = [&](uint8_t value) {
    indices[row_order[row] * width + x] = value;
    if (++x == width) {
      x = 0;
      ++row;
    }
    return row == height;
  };

  const uint32_t clear = uint32_t{1} << frame.min_code_size;
  const uint32_t end = clear + 1;
  std::array<uint8_t, kTableSize> suffix{};
  std::array<uint16_t, kTableSize> prefix{};
  std::vector<uint8_t> string;
  string.reserve(kTableSize);
  uint32_t next = clear + 2;
  int code_size = frame.min_code_size + 1;
  bool after_clear = true;
  uint32_t last_code = 0;
  uint8_t first_of_last = 0;

  size_t at = frame.data_at;
  size_t block_left = 0;
  uint64_t bits = 0;
  int bit_count = 0;
  const auto broken = [] {
    throw FormatError("GIF: broken data stream (a bad LZW code in the first frame)");
  };
  while (true) {
    while (bit_count < code_size) {
      if (block_left == 0) {
        // A sub-block is read only when all of it is there (Pillow's decoder
        // waits for it, then finds the file at its end); the terminator does
        // not end the stream (Pillow reads the next byte as a length).
        if (at >= bytes.size()) gif_truncated();
        block_left = static_cast<uint8_t>(bytes[at]);
        if (bytes.size() - at - 1 < block_left) gif_truncated();
        ++at;
        continue;
      }
      bits |= uint64_t{static_cast<uint8_t>(bytes[at++])} << bit_count;
      bit_count += 8;
      --block_left;
    }
    const auto code = static_cast<uint32_t>(bits & ((uint64_t{1} << code_size) - 1));
    bits >>= code_size;
    bit_count -= code_size;
    if (code == clear) {
      next = clear + 2;
      code_size = frame.min_code_size + 1;
      after_clear = true;
      continue;
    }
    // An end code before the last pixel: Pillow reads on into what follows
    // the image and finds the file truncated.
    if (code == end) gif_truncated();
    if (after_clear) {
      if (code > clear) broken();
      last_code = code;
      first_of_last = static_cast<uint8_t>(code);
      after_clear = false;
      if (put(static_cast<uint8_t>(code))) return;
      continue;
    }
    if (code > next) broken();
    string.clear();
    uint32_t c = code;
    if (code == next) {  // the string of the last code and its first byte
      string.push_back(first_of_last);
      c = last_code;
    }
    while (c >= clear) {
      if (c >= kTableSize || string.size() >= kTableSize) broken();
      string.push_back(suffix[c]);
      c = prefix[c];
    }
    const auto first = static_cast<uint8_t>(c);
    if (next < kTableSize) {
      suffix[next] = first;
      prefix[next] = static_cast<uint16_t>(last_code);
      if (next == (uint32_t{1} << code_size) - 1 && code_size < kMaxCodeSize) ++code_size;
      ++next;
    }
    last_code = code;
    first_of_last = first;
    if (put(first)) return;
    for (auto it = string.rbegin(); it != string.rend(); ++it) {
      if (put(*it)) return;
    }
  }
}

}  // namespace

StoredSize gif_size(std::span<const std::byte> bytes) {
  const GifFrame frame = read_first_frame(bytes);
  return {frame.canvas_width, frame.canvas_height};
}

void gif_decode(std::span<const std::byte> bytes, const DecodeOptions& options, StoredSize size,
                std::span<uint8_t> dst) {
  const GifFrame frame = read_first_frame(bytes);
  const int channels = color_mode_channels(options.mode);
  const auto width = static_cast<size_t>(size.width);
  const auto height = static_cast<size_t>(size.height);
  if (size.width != frame.canvas_width || size.height != frame.canvas_height ||
      dst.size() != width * height * static_cast<size_t>(channels)) {
    throw InvalidArgument("GIF: destination has the wrong size");
  }
  const auto frame_pixels =
      checked_mul(static_cast<size_t>(frame.width), static_cast<size_t>(frame.height));
  if (!frame_pixels) throw FormatError("GIF: image size overflows");
  std::vector<uint8_t> indices(*frame_pixels);
  decode_indices(bytes, frame, indices);
  if (channels == 4 && frame.gray_coloured && frame.transparency) {
    throw FormatError(
        "GIF: a gray frame coloured by the global palette, with a transparent index, has no RGBA "
        "conversion (as in Pillow: conversion from P to RGBA not supported)");
  }
  const uint8_t fill = frame.transparency.value_or(0);
  const auto frame_x = static_cast<size_t>(frame.x), frame_y = static_cast<size_t>(frame.y);
  const auto frame_width = static_cast<size_t>(frame.width);
  for (size_t y = 0; y < height; ++y) {
    const bool rows_of_frame = y >= frame_y && y - frame_y < static_cast<size_t>(frame.height);
    for (size_t x = 0; x < width; ++x) {
      const bool inside = rows_of_frame && x >= frame_x && x - frame_x < frame_width;
      const uint8_t index = inside ? indices[(y - frame_y) * frame_width + (x - frame_x)] : fill;
      uint8_t* pixel = dst.data() + (y * width + x) * static_cast<size_t>(channels);
      if (channels == 1 && !frame.paletted) {
        *pixel = index;
        continue;
      }
      const auto& rgb = frame.colors[index];
      put_pixel(pixel, channels, rgb[0], rgb[1], rgb[2], frame.transparency == index ? 0 : 255);
    }
  }
}

}  // namespace leanloader::detail
