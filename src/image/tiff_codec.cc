// TIFF through libtiff (Debian's libtiff6), read from memory, its errors and
// warnings kept per file (never printed). The first image of the file, as
// Pillow opens it.
//
// Pillow decodes a TIFF's samples with libtiff too, then unpacks them by its
// own rules (TiffImagePlugin's OPEN_INFO) into a mode and converts that mode,
// which libtiff's RGBA interface (TIFFReadRGBAImage) does not match: it
// scales 16-bit samples with rounding where Pillow keeps the high byte (RGB,
// CMYK) or clips at 255 (gray, "I;16"), premultiplies alpha, rounds CMYK
// differently, converts CIELab by its own formula, and refuses 12-bit, signed
// and float samples. So every layout in Pillow's table — gray of 1..32 bits
// (unsigned, signed, float), gray+alpha, 8/16-bit RGB with or without
// (associated) alpha, CMYK, CIELab, palette, contiguous or in separate planes
// — is read as samples (scanlines or tiles) and converted by Pillow's rules
// here (CIELab with LittleCMS, as Pillow's ImageCms); the rest (YCbCr,
// LogLuv...) goes through the RGBA interface.
#include <lcms2.h>
#include <tiffio.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "image/codecs.h"
#include "image/pillow_pixels.h"
#include "leanloader/core/checked_size.h"
#include "leanloader/core/error.h"

namespace leanloader::detail {

namespace {

struct MemoryFile {
  std::span<const std::byte> bytes;
  toff_t at = 0;
  std::string error;  // libtiff's first error message
};

tmsize_t read_proc(thandle_t handle, void* buffer, tmsize_t size) {
  auto* file = static_cast<MemoryFile*>(handle);
  if (size <= 0 || file->at >= file->bytes.size()) return 0;
  const size_t n = std::min<size_t>(static_cast<size_t>(size), file->bytes.size() - file->at);
  std::memcpy(buffer, file->bytes.data() + file->at, n);
  file->at += n;
  return static_cast<tmsize_t>(n);
}

tmsize_t write_proc(thandle_t, void*, tmsize_t) { return -1; }

toff_t seek_proc(thandle_t handle, toff_t offset, int whence) {
  auto* file = static_cast<MemoryFile*>(handle);
  toff_t base = 0;
  if (whence == SEEK_CUR) base = file->at;
  if (whence == SEEK_END) base = file->bytes.size();
  const auto target = checked_add(static_cast<size_t>(base), static_cast<size_t>(offset));
  if (!target) return static_cast<toff_t>(-1);
  file->at = *target;
  return file->at;
}

int close_proc(thandle_t) { return 0; }

toff_t size_proc(thandle_t handle) { return static_cast<MemoryFile*>(handle)->bytes.size(); }

int map_proc(thandle_t handle, void** base, toff_t* size) {
  auto* file = static_cast<MemoryFile*>(handle);
  *base = const_cast<std::byte*>(file->bytes.data());  // read only: the file is opened "r"
  *size = file->bytes.size();
  return 1;
}

void unmap_proc(thandle_t, void*, toff_t) {}

int keep_error(TIFF*, void* user_data, const char* module, const char* format, va_list args) {
  auto* file = static_cast<MemoryFile*>(user_data);
  if (file->error.empty()) {
    char message[512];
    std::vsnprintf(message, sizeof(message), format, args);
    file->error = (module != nullptr ? std::string(module) + ": " : std::string()) + message;
  }
  return 1;  // handled: nothing printed
}

int ignore_warning(TIFF*, void*, const char*, const char*, va_list) { return 1; }

struct TiffCloser {
  void operator()(TIFF* tif) const noexcept { TIFFClose(tif); }
};
using Tiff = std::unique_ptr<TIFF, TiffCloser>;

Tiff open_tiff(MemoryFile& file) {
  std::unique_ptr<TIFFOpenOptions, decltype(&TIFFOpenOptionsFree)> options(TIFFOpenOptionsAlloc(),
                                                                           &TIFFOpenOptionsFree);
  if (!options) throw OutOfMemory("TIFF: cannot create a decoder");
  TIFFOpenOptionsSetErrorHandlerExtR(options.get(), &keep_error, &file);
  TIFFOpenOptionsSetWarningHandlerExtR(options.get(), &ignore_warning, &file);
  // No single allocation above 1 GiB for a malformed strip or tile size.
  TIFFOpenOptionsSetMaxSingleMemAlloc(options.get(), tmsize_t{1} << 30);
  Tiff tif(TIFFClientOpenExt("TIFF", "rm", &file, read_proc, write_proc, seek_proc, close_proc,
                             size_proc, map_proc, unmap_proc, options.get()));
  if (!tif) {
    throw FormatError("TIFF: cannot read the header" +
                      (file.error.empty() ? std::string() : ": " + file.error));
  }
  return tif;
}

[[noreturn]] void fail(const MemoryFile& file, const std::string& what) {
  throw FormatError("TIFF: " + what + (file.error.empty() ? std::string() : ": " + file.error));
}

template <typename T>
T field(TIFF* tif, ttag_t tag, T fallback) {
  T value = fallback;
  if (TIFFGetFieldDefaulted(tif, tag, &value) != 1) return fallback;
  return value;
}

// The mode Pillow would hold the image in (TiffImagePlugin's OPEN_INFO), for
// the layouts read as samples.
enum class Mode {
  kRgbaInterface,      // the rest: libtiff's RGBA interface
  kGray,               // "L": 1/2/4/8-bit (8-bit signed read as unsigned, as Pillow)
  kGrayAlpha,          // "LA"
  kInteger,            // "I;16" / "I": 12/16-bit unsigned, 16/32-bit signed, clipped to 0..255
  kFloat,              // "F": 32-bit float, truncated and clipped to 0..255
  kRgb,                // "RGB" / "RGBX": 8/16-bit (a 16-bit sample's high byte)
  kRgba,               // "RGBA": unassociated alpha
  kRgbaPremultiplied,  // "RGBa": associated alpha, divided out as Pillow's unpacker
  kCmyk,               // "CMYK": 8/16-bit, Pillow's cmyk2rgb
  kLab,                // "LAB": CIELab through LittleCMS, as Pillow's ImageCms
  kYCbCr,              // "YCbCr": uncompressed, not subsampled; Pillow's ycbcr2rgb (L: Y)
  kPalette,            // "P"
};

struct Description {
  Mode mode = Mode::kRgbaInterface;
  uint16_t bits = 8;
  uint16_t format = SAMPLEFORMAT_UINT;
  uint16_t samples = 1;   // stored per pixel
  bool separate = false;  // planar separate: one plane per sample
  uint16_t planes = 1;    // the planes read and interleaved (separate only)
  bool min_is_white = false;
};

// True when every extra sample in [begin, end) is "unspecified" (no alpha).
bool all_unspecified(std::vector<uint16_t>::const_iterator begin,
                     std::vector<uint16_t>::const_iterator end) {
  return std::all_of(begin, end, [](uint16_t e) { return e == EXTRASAMPLE_UNSPECIFIED; });
}

Description describe(TIFF* tif) {
  Description d;
  d.bits = field<uint16_t>(tif, TIFFTAG_BITSPERSAMPLE, 1);
  d.samples = field<uint16_t>(tif, TIFFTAG_SAMPLESPERPIXEL, 1);
  d.format = field<uint16_t>(tif, TIFFTAG_SAMPLEFORMAT, SAMPLEFORMAT_UINT);
  const auto photometric = field<uint16_t>(tif, TIFFTAG_PHOTOMETRIC, PHOTOMETRIC_MINISBLACK);
  const bool separate =
      field<uint16_t>(tif, TIFFTAG_PLANARCONFIG, PLANARCONFIG_CONTIG) == PLANARCONFIG_SEPARATE;
  uint16_t extra_count = 0;
  uint16_t* extra_types = nullptr;
  TIFFGetFieldDefaulted(tif, TIFFTAG_EXTRASAMPLES, &extra_count, &extra_types);
  std::vector<uint16_t> extra(extra_types, extra_types + (extra_types ? extra_count : 0));
  uint16_t used = d.samples;
  // Unspecified extra samples stored as planes of their own are ignored.
  if (separate && !extra.empty() && all_unspecified(extra.begin(), extra.end())) {
    used = static_cast<uint16_t>(std::max(0, used - static_cast<int>(extra.size())));
    extra.clear();
  }
  if (used == 0) return d;
  const bool gray = photometric == PHOTOMETRIC_MINISBLACK || photometric == PHOTOMETRIC_MINISWHITE;
  d.min_is_white = photometric == PHOTOMETRIC_MINISWHITE;
  const bool uint = d.format == SAMPLEFORMAT_UINT;
  const bool sint = d.format == SAMPLEFORMAT_INT;
  const uint16_t first_extra = extra.empty() ? 0xffff : extra[0];
  // Extra samples after the first must be unspecified (Pillow's RGBAXX, CMYKXX).
  const bool rest_unspecified =
      extra.size() <= 1 || all_unspecified(extra.begin() + 1, extra.end());
  Mode mode = Mode::kRgbaInterface;
  if (gray && used == 1 && extra.empty()) {
    if (uint && (d.bits == 1 || d.bits == 2 || d.bits == 4 || d.bits == 8)) {
      mode = Mode::kGray;
    } else if (sint && d.bits == 8 && !d.min_is_white) {
      mode = Mode::kGray;
    } else if ((uint && d.bits == 16) ||
               (!d.min_is_white && ((uint && d.bits == 12) || (sint && d.bits == 16) ||
                                    (d.bits == 32 && (uint || sint))))) {
      mode = Mode::kInteger;
    } else if (d.format == SAMPLEFORMAT_IEEEFP && d.bits == 32) {
      mode = Mode::kFloat;
    }
  } else if (photometric == PHOTOMETRIC_MINISBLACK && uint && d.bits == 8 && used == 2 &&
             extra.size() == 1) {
    if (first_extra == EXTRASAMPLE_UNSPECIFIED) mode = Mode::kGray;
    if (first_extra == EXTRASAMPLE_UNASSALPHA) mode = Mode::kGrayAlpha;
  } else if (photometric == PHOTOMETRIC_RGB && uint && (d.bits == 8 || d.bits == 16) &&
             used == 3 + extra.size() && rest_unspecified && (d.bits == 8 || extra.size() <= 1)) {
    if (extra.empty()) {
      mode = Mode::kRgb;
    } else if (first_extra == EXTRASAMPLE_UNSPECIFIED) {
      mode = Mode::kRgb;
    } else if (first_extra == EXTRASAMPLE_ASSOCALPHA) {
      mode = Mode::kRgbaPremultiplied;
    } else if (first_extra == EXTRASAMPLE_UNASSALPHA || first_extra == 999) {
      mode = Mode::kRgba;  // 999: Corel Draw 10, as Pillow
    }
  } else if (photometric == PHOTOMETRIC_RGB && uint && (d.bits == 8 || d.bits == 16) && used == 4 &&
             extra.empty()) {
    mode = Mode::kRgba;  // a fourth sample without ExtraSamples: Pillow reads it as alpha
  } else if (photometric == PHOTOMETRIC_PALETTE && uint && used == 1 && extra.empty() &&
             d.bits <= 8) {
    mode = Mode::kPalette;
  } else if (photometric == PHOTOMETRIC_SEPARATED && uint &&
             ((d.bits == 8 && used == 4 + extra.size() && extra.size() <= 2 &&
               all_unspecified(extra.begin(), extra.end())) ||
              (d.bits == 16 && used == 4 && extra.empty()))) {
    mode = Mode::kCmyk;
  } else if (photometric == PHOTOMETRIC_CIELAB && uint && d.bits == 8 && used == 3 &&
             extra.empty()) {
    mode = Mode::kLab;
  } else if (photometric == PHOTOMETRIC_YCBCR && uint && d.bits == 8 && used == 3 &&
             extra.empty() && !separate &&
             field<uint16_t>(tif, TIFFTAG_COMPRESSION, COMPRESSION_NONE) == COMPRESSION_NONE) {
    // Pillow reads uncompressed YCbCr itself, as samples in mode "YCbCr"
    // (compressed ones go through libtiff's RGBA interface, as here).
    uint16_t horizontal = 1, vertical = 1;
    TIFFGetFieldDefaulted(tif, TIFFTAG_YCBCRSUBSAMPLING, &horizontal, &vertical);
    if (horizontal == 1 && vertical == 1) mode = Mode::kYCbCr;
  }
  // Separate planes are interleaved here byte-wise: whole-byte samples only.
  if (separate && d.samples > 1 && d.bits % 8 != 0) mode = Mode::kRgbaInterface;
  d.mode = mode;
  d.separate = separate && d.samples > 1;
  if (d.separate) d.planes = used;
  return d;
}

// Every row's samples, rows without padding, of one sample plane (`plane`
// 0 for contiguous images), from strips or tiles.
std::vector<uint8_t> read_plane(TIFF* tif, const MemoryFile& file, const Description& d,
                                uint16_t plane, uint32_t width, uint32_t height) {
  const tmsize_t row_bytes = TIFFScanlineSize(tif);
  if (row_bytes <= 0) fail(file, "bad row size");
  const auto total = checked_mul(static_cast<size_t>(row_bytes), height);
  if (!total) fail(file, "image size overflows");
  std::vector<uint8_t> rows(*total);
  if (!TIFFIsTiled(tif)) {
    for (uint32_t y = 0; y < height; ++y) {
      if (TIFFReadScanline(tif, rows.data() + static_cast<size_t>(y) * row_bytes, y, plane) < 0) {
        fail(file, "cannot read row " + std::to_string(y));
      }
    }
    return rows;
  }
  uint32_t tile_width = 0, tile_height = 0;
  TIFFGetField(tif, TIFFTAG_TILEWIDTH, &tile_width);
  TIFFGetField(tif, TIFFTAG_TILELENGTH, &tile_height);
  const tmsize_t tile_row_bytes = TIFFTileRowSize(tif);
  const tmsize_t tile_bytes = TIFFTileSize(tif);
  // A tile larger than the image needs (by a wide margin) is a malformed
  // header, not a reason to allocate gigabytes.
  if (tile_width == 0 || tile_height == 0 || tile_row_bytes <= 0 || tile_bytes <= 0 ||
      static_cast<size_t>(tile_bytes) > std::max(*total * 4, size_t{64} << 20)) {
    fail(file, "bad tile size (" + std::to_string(tile_width) + "x" + std::to_string(tile_height) +
                   " for a " + std::to_string(width) + "x" + std::to_string(height) + " image)");
  }
  std::vector<uint8_t> tile(static_cast<size_t>(tile_bytes));
  const size_t pixel_bits = static_cast<size_t>(d.bits) * (d.separate ? 1 : d.samples);
  for (uint32_t y = 0; y < height; y += tile_height) {
    for (uint32_t x = 0; x < width; x += tile_width) {
      if (TIFFReadTile(tif, tile.data(), x, y, 0, plane) < 0) {
        fail(file, "cannot read the tile at " + std::to_string(x) + "," + std::to_string(y));
      }
      const uint32_t rows_here = std::min(tile_height, height - y);
      const uint32_t columns_here = std::min(tile_width, width - x);
      // Tile widths are multiples of 16: a tile starts on a byte.
      const size_t start = x * pixel_bits / 8;
      const size_t copy = (columns_here * pixel_bits + 7) / 8;
      for (uint32_t r = 0; r < rows_here; ++r) {
        std::memcpy(rows.data() + (static_cast<size_t>(y) + r) * row_bytes + start,
                    tile.data() + static_cast<size_t>(r) * tile_row_bytes, copy);
      }
    }
  }
  return rows;
}

// Every row's samples, pixel-interleaved: contiguous images as stored,
// separate planes interleaved (whole-byte samples, see describe). Returns the
// row size in bytes through `row_bytes`.
std::vector<uint8_t> read_samples(TIFF* tif, const MemoryFile& file, const Description& d,
                                  uint32_t width, uint32_t height, size_t& row_bytes) {
  if (!d.separate) {
    std::vector<uint8_t> rows = read_plane(tif, file, d, 0, width, height);
    row_bytes = rows.size() / height;
    return rows;
  }
  const size_t sample_bytes = d.bits / 8;
  const auto pixels = checked_mul(static_cast<size_t>(width), height);
  const auto total = pixels ? checked_mul(*pixels, sample_bytes * d.planes) : std::nullopt;
  if (!total) fail(file, "image size overflows");
  row_bytes = static_cast<size_t>(width) * sample_bytes * d.planes;
  std::vector<uint8_t> rows(*total);
  for (uint16_t plane = 0; plane < d.planes; ++plane) {
    const std::vector<uint8_t> samples = read_plane(tif, file, d, plane, width, height);
    const size_t plane_row_bytes = samples.size() / height;
    for (uint32_t y = 0; y < height; ++y) {
      const uint8_t* from = samples.data() + y * plane_row_bytes;
      uint8_t* to = rows.data() + y * row_bytes + plane * sample_bytes;
      for (uint32_t x = 0; x < width; ++x) {
        std::memcpy(to + static_cast<size_t>(x) * sample_bytes * d.planes,
                    from + static_cast<size_t>(x) * sample_bytes, sample_bytes);
      }
    }
  }
  return rows;
}

// The unsigned sample at `index` of a row of `bits`-bit samples (MSB first,
// as libtiff returns them; 16 and 32 bits in native order).
uint32_t sample(const uint8_t* row, size_t index, uint16_t bits) {
  switch (bits) {
    case 8:
      return row[index];
    case 16: {
      uint16_t value;
      std::memcpy(&value, row + 2 * index, 2);
      return value;
    }
    case 32: {
      uint32_t value;
      std::memcpy(&value, row + 4 * index, 4);
      return value;
    }
    default: {
      const size_t bit = index * bits;
      if (bits > 8) {  // 12-bit: may span three bytes
        uint32_t value = 0;
        for (size_t b = bit; b < bit + bits; ++b)
          value = (value << 1) | ((row[b / 8] >> (7 - b % 8)) & 1);
        return value;
      }
      return (row[bit / 8] >> (8 - bits - bit % 8)) & ((1u << bits) - 1);
    }
  }
}

// Pillow's mode "I" / "I;16" value of an integer sample: 16-bit signed
// sign-extended, 32-bit (signed or not: Pillow's "I;32N" reads int32) as int32.
int64_t integer_sample(const uint8_t* row, size_t index, const Description& d) {
  const uint32_t raw = sample(row, index, d.bits);
  if (d.bits == 16 && d.format == SAMPLEFORMAT_INT) return static_cast<int16_t>(raw);
  if (d.bits == 32) return static_cast<int32_t>(raw);
  return raw;
}

// Pillow's "RGBa" unpacker: the colour divided by the alpha, truncated.
void unpremultiply(uint8_t& r, uint8_t& g, uint8_t& b, uint8_t a) {
  if (a == 0) {
    r = g = b = 0;
  } else if (a != 255) {
    r = clip8(r * 255 / a);
    g = clip8(g * 255 / a);
    b = clip8(b * 255 / a);
  }
}

struct LcmsContextDeleter {
  void operator()(cmsContext context) const noexcept { cmsDeleteContext(context); }
};
struct LcmsProfileCloser {
  void operator()(void* profile) const noexcept { cmsCloseProfile(profile); }
};
struct LcmsTransformDeleter {
  void operator()(void* transform) const noexcept { cmsDeleteTransform(transform); }
};

// CIELab (8-bit, a* and b* signed as TIFF stores them) to sRGB as Pillow's
// LAB -> RGB convert does it: ImageCms with LittleCMS, a Lab (v2, D50)
// profile to the sRGB profile, perceptual intent, 4 bytes per pixel each side.
// `rows` holds the samples as read (row_bytes a row, `stride` samples a
// pixel, L a* b* first); `rgba` receives 4 bytes a pixel, rows unpadded.
void lab_to_rgb(const MemoryFile& file, const std::vector<uint8_t>& rows, size_t row_bytes,
                size_t stride, uint32_t width, uint32_t height, std::vector<uint8_t>& rgba) {
  std::unique_ptr<_cmsContext_struct, LcmsContextDeleter> context(
      cmsCreateContext(nullptr, nullptr));
  if (!context) throw OutOfMemory("TIFF: cannot create a colour transform");
  std::unique_ptr<void, LcmsProfileCloser> lab_profile(
      cmsCreateLab2ProfileTHR(context.get(), nullptr));
  std::unique_ptr<void, LcmsProfileCloser> srgb(cmsCreate_sRGBProfileTHR(context.get()));
  if (!lab_profile || !srgb) fail(file, "cannot create the CIELab and sRGB profiles");
  const cmsUInt32Number lab_format =
      COLORSPACE_SH(PT_LabV2) | CHANNELS_SH(3) | BYTES_SH(1) | EXTRA_SH(1);
  std::unique_ptr<void, LcmsTransformDeleter> transform(cmsCreateTransformTHR(
      context.get(), lab_profile.get(), lab_format, srgb.get(), TYPE_RGBA_8, INTENT_PERCEPTUAL, 0));
  if (!transform) fail(file, "cannot create the CIELab to sRGB transform");
  const size_t pixels = static_cast<size_t>(width) * height;
  std::vector<uint8_t> input(pixels * 4);
  for (uint32_t y = 0; y < height; ++y) {
    for (uint32_t x = 0; x < width; ++x) {
      const uint8_t* lab = rows.data() + y * row_bytes + static_cast<size_t>(x) * stride;
      uint8_t* in = input.data() + (static_cast<size_t>(y) * width + x) * 4;
      in[0] = lab[0];
      in[1] = lab[1] ^ 0x80;  // signed in the file, offset in Pillow's LAB
      in[2] = lab[2] ^ 0x80;
      in[3] = 255;
    }
  }
  rgba.resize(pixels * 4);
  cmsDoTransform(transform.get(), input.data(), rgba.data(), static_cast<cmsUInt32Number>(pixels));
}

void convert_samples(TIFF* tif, const MemoryFile& file, const Description& d, uint32_t width,
                     uint32_t height, int channels, std::span<uint8_t> dst) {
  size_t row_bytes = 0;
  const std::vector<uint8_t> rows = read_samples(tif, file, d, width, height, row_bytes);
  const size_t stride = d.separate ? d.planes : d.samples;  // samples per pixel as read
  uint16_t *red = nullptr, *green = nullptr, *blue = nullptr;
  if (d.mode == Mode::kPalette && !TIFFGetField(tif, TIFFTAG_COLORMAP, &red, &green, &blue)) {
    fail(file, "a palette image without a colour map");
  }
  std::vector<uint8_t> lab_rgba;
  if (d.mode == Mode::kLab) lab_to_rgb(file, rows, row_bytes, stride, width, height, lab_rgba);
  const uint32_t max = (1u << std::min<uint16_t>(d.bits, 16)) - 1;
  const int shift = d.bits == 16 ? 8 : 0;  // Pillow keeps a 16-bit colour sample's high byte
  for (uint32_t y = 0; y < height; ++y) {
    const uint8_t* row = rows.data() + static_cast<size_t>(y) * row_bytes;
    for (uint32_t x = 0; x < width; ++x) {
      uint8_t* pixel = dst.data() + (static_cast<size_t>(y) * width + x) * channels;
      const size_t base = static_cast<size_t>(x) * stride;
      const auto at = [&](size_t i) {
        return static_cast<uint8_t>(sample(row, base + i, d.bits) >> shift);
      };
      switch (d.mode) {
        case Mode::kGray:
        case Mode::kGrayAlpha: {
          uint32_t value = sample(row, base, d.bits);
          if (d.min_is_white) value = max - value;
          const auto gray = static_cast<uint8_t>(value * 255 / max);  // 1/2/4 bits: exact
          put_pixel(pixel, channels, gray, gray, gray,
                    d.mode == Mode::kGrayAlpha ? at(1) : uint8_t{255});
          break;
        }
        case Mode::kInteger: {
          const auto gray =
              static_cast<uint8_t>(std::clamp<int64_t>(integer_sample(row, base, d), 0, 255));
          put_pixel(pixel, channels, gray, gray, gray);
          break;
        }
        case Mode::kFloat: {
          float value;
          std::memcpy(&value, row + 4 * base, 4);
          const uint8_t gray = pillow_float_to_gray(value);
          put_pixel(pixel, channels, gray, gray, gray);
          break;
        }
        case Mode::kRgb:
          put_pixel(pixel, channels, at(0), at(1), at(2));
          break;
        case Mode::kRgba:
          put_pixel(pixel, channels, at(0), at(1), at(2), at(3));
          break;
        case Mode::kRgbaPremultiplied: {
          uint8_t r = at(0), g = at(1), b = at(2);
          const uint8_t a = at(3);
          unpremultiply(r, g, b, a);
          put_pixel(pixel, channels, r, g, b, a);
          break;
        }
        case Mode::kCmyk: {
          const Rgb rgb = pillow_cmyk_to_rgb(at(0), at(1), at(2), at(3));
          put_pixel(pixel, channels, rgb.r, rgb.g, rgb.b);
          break;
        }
        case Mode::kYCbCr: {
          if (channels == 1) {
            pixel[0] = at(0);  // Pillow's ycbcr2l: the Y sample
            break;
          }
          const Rgb rgb = pillow_ycbcr_to_rgb(at(0), at(1), at(2));
          put_pixel(pixel, channels, rgb.r, rgb.g, rgb.b);
          break;
        }
        case Mode::kLab: {
          const uint8_t* rgba = lab_rgba.data() + (static_cast<size_t>(y) * width + x) * 4;
          put_pixel(pixel, channels, rgba[0], rgba[1], rgba[2]);
          break;
        }
        case Mode::kPalette: {
          const uint32_t index = sample(row, base, d.bits);
          put_pixel(pixel, channels, static_cast<uint8_t>(red[index] >> 8),
                    static_cast<uint8_t>(green[index] >> 8),
                    static_cast<uint8_t>(blue[index] >> 8));
          break;
        }
        case Mode::kRgbaInterface:
          break;
      }
    }
  }
}

void convert_rgba_interface(TIFF* tif, const MemoryFile& file, uint32_t width, uint32_t height,
                            int channels, std::span<uint8_t> dst) {
  char why[1024] = "";
  if (!TIFFRGBAImageOK(tif, why)) fail(file, std::string("unsupported image: ") + why);
  // The rows as stored, top first: asking for the file's own orientation
  // makes libtiff flip nothing (the orientation is applied afterwards, as
  // Pillow's exif_transpose does).
  const auto orientation = field<uint16_t>(tif, TIFFTAG_ORIENTATION, ORIENTATION_TOPLEFT);
  const auto pixels = checked_mul(static_cast<size_t>(width), height);
  if (!pixels) fail(file, "image size overflows");
  std::vector<uint32_t> raster(*pixels);
  if (!TIFFReadRGBAImageOriented(tif, width, height, raster.data(), orientation, 0)) {
    fail(file, "cannot decode the image");
  }
  for (size_t i = 0; i < *pixels; ++i) {
    const uint32_t value = raster[i];
    put_pixel(dst.data() + i * channels, channels, static_cast<uint8_t>(TIFFGetR(value)),
              static_cast<uint8_t>(TIFFGetG(value)), static_cast<uint8_t>(TIFFGetB(value)),
              static_cast<uint8_t>(TIFFGetA(value)));
  }
}

}  // namespace

StoredSize tiff_size(std::span<const std::byte> bytes) {
  MemoryFile file{bytes, 0, {}};
  Tiff tif = open_tiff(file);
  uint32_t width = 0, height = 0;
  TIFFGetField(tif.get(), TIFFTAG_IMAGEWIDTH, &width);
  TIFFGetField(tif.get(), TIFFTAG_IMAGELENGTH, &height);
  return {width, height};
}

void tiff_decode(std::span<const std::byte> bytes, const DecodeOptions& options, StoredSize size,
                 std::span<uint8_t> dst) {
  MemoryFile file{bytes, 0, {}};
  Tiff tif = open_tiff(file);
  const int channels = color_mode_channels(options.mode);
  const auto width = static_cast<uint32_t>(size.width);
  const auto height = static_cast<uint32_t>(size.height);
  if (dst.size() != static_cast<size_t>(width) * height * static_cast<size_t>(channels)) {
    throw InvalidArgument("TIFF: destination has the wrong size");
  }
  const Description description = describe(tif.get());
  if (description.mode == Mode::kRgbaInterface) {
    if (description.format != SAMPLEFORMAT_UINT) {
      // Pillow has no mode for these either ("unknown pixel mode").
      fail(file, std::string("samples of ") +
                     (description.format == SAMPLEFORMAT_IEEEFP ? "floating-point" : "signed") +
                     " format in this layout are not supported (as in Pillow)");
    }
    convert_rgba_interface(tif.get(), file, width, height, channels, dst);
  } else {
    convert_samples(tif.get(), file, description, width, height, channels, dst);
  }
}

}  // namespace leanloader::detail
