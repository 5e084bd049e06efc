// PBM, PGM and PPM (plain P1-P3 and raw P4-P6) as Pillow's PpmImagePlugin
// reads them, byte for byte: its header tokens (comments, at most 10
// characters), its modes ("1", "L", "I" for 16-bit gray, "RGB"), its scaling
// of a maxval other than 255 (round(value / maxval * out_max), Python's
// round: ties to even), and its refusals (a value above maxval in a plain
// file, a short file), and PFM ("Pf", mode "F": 32-bit floats, bottom row
// first). Then Pillow's conversion to the requested mode: "1" is 0 or 255,
// "I" clips at 255, "F" truncates and clips to 0..255, RGB to L is Pillow's
// luma.
//
// Why our own reader: the format is a few lines of rules, and Debian's
// libnetpbm reports errors by exiting the process (pm_error), which a loader
// thread cannot use.
#include <bit>
#include <cfenv>
#include <charconv>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "image/codecs.h"
#include "image/pillow_pixels.h"
#include "leanloader/core/checked_size.h"
#include "leanloader/core/error.h"

namespace leanloader::detail {

namespace {

bool is_space(unsigned char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

struct PnmHeader {
  char kind = 0;  // '1'..'6', or 'f' (PFM, Pillow's mode "F")
  int64_t width = 0;
  int64_t height = 0;
  uint32_t maxval = 1;
  bool little_endian = false;  // PFM ('f') only
  size_t data_offset = 0;
};

class HeaderReader {
 public:
  explicit HeaderReader(std::span<const std::byte> bytes) : bytes_(bytes) {}

  int read() { return at_ < bytes_.size() ? static_cast<int>(bytes_[at_++]) : -1; }
  size_t position() const { return at_; }

  // Pillow's _read_token: whitespace-separated, '#' starts a comment that
  // runs to CR or LF (and may sit inside a token), at most 10 characters.
  std::string token() {
    std::string token;
    while (token.size() <= 10) {
      const int c = read();
      if (c < 0) break;
      if (is_space(static_cast<unsigned char>(c))) {
        if (token.empty()) continue;
        break;
      }
      if (c == '#') {
        for (int d = read(); d >= 0 && d != '\r' && d != '\n'; d = read()) {
        }
        continue;
      }
      token += static_cast<char>(c);
    }
    if (token.empty())
      throw FormatError("PPM: reached the end of the file while reading the header");
    if (token.size() > 10) throw FormatError("PPM: token too long in the header: " + token);
    return token;
  }

  int64_t number(const char* what) {
    const std::string text = token();
    int64_t value = 0;
    for (const char c : text) {
      if (c < '0' || c > '9' || value > (int64_t{1} << 40)) {
        throw FormatError(std::string("PPM: the ") + what + " is not a number: '" + text + "'");
      }
      value = value * 10 + (c - '0');
    }
    return value;
  }

 private:
  std::span<const std::byte> bytes_;
  size_t at_ = 0;
};

PnmHeader parse_header(std::span<const std::byte> bytes) {
  HeaderReader reader(bytes);
  std::string magic;
  for (int i = 0; i < 6; ++i) {
    const int c = reader.read();
    if (c < 0 || is_space(static_cast<unsigned char>(c))) break;
    magic += static_cast<char>(c);
  }
  if (magic == "P0CMYK" || magic.rfind("Py", 0) == 0) {
    throw FormatError("PPM: '" + magic +
                      "' files (CMYK, Pillow's test variants) are "
                      "not supported; convert the image to P1-P6");
  }
  const bool pfm = magic == "Pf";
  if (!pfm && (magic.size() != 2 || magic[0] != 'P' || magic[1] < '1' || magic[1] > '6')) {
    throw FormatError("PPM: not a PPM file (magic '" + magic + "')");
  }
  PnmHeader header;
  header.kind = magic[1];
  header.width = reader.number("width");
  header.height = reader.number("height");
  if (pfm) {
    // Pillow's float(token): finite and non-zero; its sign is the byte order.
    const std::string text = reader.token();
    double scale = 0.0;
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), scale);
    if (error != std::errc() || end != text.data() + text.size()) {
      throw FormatError("PPM: the PFM scale is not a number: '" + text + "'");
    }
    if (scale == 0.0 || !std::isfinite(scale)) {
      throw FormatError("PPM: the PFM scale must be finite and non-zero");
    }
    header.little_endian = scale < 0;
  } else if (header.kind != '1' && header.kind != '4') {
    const int64_t maxval = reader.number("maxval");
    if (maxval <= 0 || maxval >= 65536) {
      throw FormatError("PPM: maxval must be greater than 0 and less than 65536, not " +
                        std::to_string(maxval));
    }
    header.maxval = static_cast<uint32_t>(maxval);
  }
  header.data_offset = reader.position();
  return header;
}

// Python's round(value / maxval * out_max): ties to even.
uint32_t scaled(uint32_t value, uint32_t maxval, uint32_t out_max) {
  const double exact = static_cast<double>(value) / maxval * out_max;
  return static_cast<uint32_t>(std::nearbyint(exact));  // the default mode: to nearest, even
}

[[noreturn]] void short_data() {
  throw FormatError("PPM: image file is truncated (not enough image data)");
}

// The plain formats' numbers, one by one, with Pillow's comment and token rules.
class PlainTokens {
 public:
  explicit PlainTokens(std::span<const std::byte> data) : data_(data) {}

  // The next token, or "" at the end of the data.
  std::string next() {
    std::string token;
    while (at_ < data_.size()) {
      const auto c = static_cast<unsigned char>(data_[at_]);
      if (c == '#') {
        while (at_ < data_.size() && data_[at_] != std::byte{'\n'} &&
               data_[at_] != std::byte{'\r'}) {
          ++at_;
        }
        if (at_ < data_.size()) ++at_;  // the CR or LF goes with the comment
        continue;
      }
      ++at_;
      if (is_space(c)) {
        if (token.empty()) continue;
        break;
      }
      token += static_cast<char>(c);
    }
    return token;
  }

 private:
  std::span<const std::byte> data_;
  size_t at_ = 0;
};

// Decodes into `gray` (modes 1, L, I: one value per pixel, I before its clip)
// or `rgb` (three per pixel). Values are at most `out_max`.
void decode_values(std::span<const std::byte> bytes, const PnmHeader& header, size_t pixels,
                   std::vector<uint32_t>& values) {
  const std::span<const std::byte> data = bytes.subspan(header.data_offset);
  const bool color = header.kind == '3' || header.kind == '6';
  const size_t bands = color ? 3 : 1;
  const auto count = checked_mul(pixels, bands);
  if (!count) throw FormatError("PPM: image size overflows");
  values.resize(*count);
  const bool wide_gray = !color && header.maxval > 255;  // Pillow's mode "I"
  const uint32_t out_max = wide_gray ? 65535 : 255;
  const auto width = static_cast<size_t>(header.width);
  switch (header.kind) {
    case '4': {  // packed bits, rows padded to a byte; 1 is black
      const size_t row_bytes = (width + 7) / 8;
      const auto needed = checked_mul(row_bytes, static_cast<size_t>(header.height));
      if (!needed || data.size() < *needed) short_data();
      for (size_t y = 0; y < static_cast<size_t>(header.height); ++y) {
        for (size_t x = 0; x < width; ++x) {
          const auto byte = static_cast<unsigned>(data[y * row_bytes + x / 8]);
          values[y * width + x] = (byte >> (7 - x % 8)) & 1 ? 0 : 255;
        }
      }
      return;
    }
    case '1': {  // '0' and '1' characters, whitespace optional
      size_t filled = 0;
      PlainTokens tokens(data);
      for (std::string token = tokens.next(); !token.empty() && filled < values.size();
           token = tokens.next()) {
        for (const char c : token) {
          if (c != '0' && c != '1') {
            throw FormatError(std::string("PPM: invalid token for this mode: ") + c);
          }
          if (filled < values.size()) values[filled++] = c == '1' ? 0 : 255;
        }
      }
      if (filled < values.size()) short_data();
      return;
    }
    case '2':
    case '3': {
      size_t filled = 0;
      PlainTokens tokens(data);
      while (filled < values.size()) {
        const std::string token = tokens.next();
        if (token.empty()) short_data();
        if (token.size() > 10) throw FormatError("PPM: token too long in the data: " + token);
        uint64_t value = 0;
        for (const char c : token) {
          if (c < '0' || c > '9') {
            throw FormatError("PPM: channel value is not a number: '" + token + "'");
          }
          value = value * 10 + static_cast<uint64_t>(c - '0');
        }
        if (value > header.maxval) {
          throw FormatError("PPM: channel value too large for this mode: " + token);
        }
        values[filled++] = scaled(static_cast<uint32_t>(value), header.maxval, out_max);
      }
      return;
    }
    default:
      break;
  }
  // P5, P6: raw samples, one byte each up to maxval 255, else two (big-endian).
  const size_t sample_bytes = header.maxval < 256 ? 1 : 2;
  const auto needed = checked_mul(*count, sample_bytes);
  if (!needed || data.size() < *needed) short_data();
  const auto* in = reinterpret_cast<const unsigned char*>(data.data());
  for (size_t i = 0; i < values.size(); ++i) {
    const uint32_t raw = sample_bytes == 1 ? in[i] : (uint32_t{in[2 * i]} << 8) | in[2 * i + 1];
    if (header.maxval == 255 || (wide_gray && header.maxval == 65535)) {
      values[i] = raw;  // Pillow's raw decoder ("L", "RGB", "I;16B")
    } else {
      values[i] = std::min(out_max, scaled(raw, header.maxval, out_max));
    }
  }
}

// PFM: 32-bit floats, rows bottom first (Pillow's raw decoder with
// orientation -1), converted as Pillow's F -> L.
void decode_pfm(std::span<const std::byte> bytes, const PnmHeader& header, size_t pixels,
                int channels, std::span<uint8_t> dst) {
  const std::span<const std::byte> data = bytes.subspan(header.data_offset);
  const auto needed = checked_mul(pixels, size_t{4});
  if (!needed || data.size() < *needed) short_data();
  const auto width = static_cast<size_t>(header.width);
  const auto height = static_cast<size_t>(header.height);
  const bool swap = header.little_endian != (std::endian::native == std::endian::little);
  for (size_t y = 0; y < height; ++y) {
    const std::byte* row = data.data() + (height - 1 - y) * width * 4;
    for (size_t x = 0; x < width; ++x) {
      uint32_t bits;
      std::memcpy(&bits, row + x * 4, 4);
      if (swap) bits = __builtin_bswap32(bits);
      const uint8_t gray = pillow_float_to_gray(std::bit_cast<float>(bits));
      put_pixel(dst.data() + (y * width + x) * static_cast<size_t>(channels), channels, gray, gray,
                gray);
    }
  }
}

}  // namespace

StoredSize pnm_size(std::span<const std::byte> bytes) {
  const PnmHeader header = parse_header(bytes);
  return {header.width, header.height};
}

void pnm_decode(std::span<const std::byte> bytes, const DecodeOptions& options, StoredSize size,
                std::span<uint8_t> dst) {
  const PnmHeader header = parse_header(bytes);
  const size_t pixels = static_cast<size_t>(size.width) * static_cast<size_t>(size.height);
  const int channels = color_mode_channels(options.mode);
  if (dst.size() != pixels * static_cast<size_t>(channels)) {
    throw InvalidArgument("PPM: destination has the wrong size");
  }
  if (header.kind == 'f') {
    decode_pfm(bytes, header, pixels, channels, dst);
    return;
  }
  std::vector<uint32_t> values;
  decode_values(bytes, header, pixels, values);
  const bool color = header.kind == '3' || header.kind == '6';
  for (size_t i = 0; i < pixels; ++i) {
    uint8_t* pixel = dst.data() + i * static_cast<size_t>(channels);
    if (color) {
      put_pixel(pixel, channels, static_cast<uint8_t>(values[3 * i]),
                static_cast<uint8_t>(values[3 * i + 1]), static_cast<uint8_t>(values[3 * i + 2]));
    } else {
      // "1" and "L" as they are; "I" clipped at 255 by Pillow's conversions.
      const auto value = static_cast<uint8_t>(std::min<uint32_t>(values[i], 255));
      put_pixel(pixel, channels, value, value, value);
    }
  }
}

}  // namespace leanloader::detail
