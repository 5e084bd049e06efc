// TIFF through libtiff (Debian's libtiff6), read from memory, its errors and
// warnings kept per file (never printed). The first image of the file, as
// Pillow opens it.
//
// Pillow decodes a TIFF's samples with libtiff too, then unpacks them by its
// own rules into a mode and converts that mode, which libtiff's RGBA
// interface (TIFFReadRGBAImage) does not match everywhere: it scales 16-bit
// samples with rounding where Pillow keeps the high byte (RGB) or clips at 255
// (16-bit gray, mode "I;16"), and premultiplies unassociated alpha. So the
// layouts Pillow unpacks itself — 1/2/4/8/16-bit gray (min-is-black or
// min-is-white, with or without alpha), 8/16-bit RGB(A), palette — are read
// as samples (scanlines or tiles) and converted by Pillow's rules here; the
// rest (YCbCr, CMYK, LogLuv, planar separate...) goes through the RGBA
// interface. Sample formats other than unsigned integers (float, signed) are
// refused with the reason.
#include <tiffio.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "image/codecs.h"
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

// How Pillow would hold the image, for the layouts read as samples.
enum class Layout { kRgbaInterface, kGray, kGrayAlpha, kRgb, kRgba, kPalette };

struct Description {
  Layout layout = Layout::kRgbaInterface;
  uint16_t bits = 8;
  uint16_t samples = 1;
  bool min_is_white = false;
  bool alpha = false;  // the fourth RGB sample is alpha (not "unspecified": Pillow's RGBX)
};

Description describe(TIFF* tif) {
  Description d;
  d.bits = field<uint16_t>(tif, TIFFTAG_BITSPERSAMPLE, 1);
  d.samples = field<uint16_t>(tif, TIFFTAG_SAMPLESPERPIXEL, 1);
  const auto photometric = field<uint16_t>(tif, TIFFTAG_PHOTOMETRIC, PHOTOMETRIC_MINISBLACK);
  const auto format = field<uint16_t>(tif, TIFFTAG_SAMPLEFORMAT, SAMPLEFORMAT_UINT);
  const auto planar = field<uint16_t>(tif, TIFFTAG_PLANARCONFIG, PLANARCONFIG_CONTIG);
  uint16_t extra_count = 0;
  uint16_t* extra = nullptr;
  TIFFGetFieldDefaulted(tif, TIFFTAG_EXTRASAMPLES, &extra_count, &extra);
  const bool associated = extra_count > 0 && extra != nullptr && extra[0] == EXTRASAMPLE_ASSOCALPHA;
  if (format != SAMPLEFORMAT_UINT) {
    // Pillow reads these as modes "I;16S", "I", "F" and converts them by
    // clipping; not done here yet: refused, with the reason.
    throw FormatError(std::string("TIFF: samples of ") +
                      (format == SAMPLEFORMAT_IEEEFP ? "floating-point" : "signed or other") +
                      " format are not supported (unsigned integer samples are); convert the "
                      "image, or decode it with Pillow");
  }
  if (planar != PLANARCONFIG_CONTIG && d.samples > 1) return d;
  const bool gray = photometric == PHOTOMETRIC_MINISBLACK || photometric == PHOTOMETRIC_MINISWHITE;
  d.min_is_white = photometric == PHOTOMETRIC_MINISWHITE;
  if (gray && d.samples == 1 &&
      (d.bits == 1 || d.bits == 2 || d.bits == 4 || d.bits == 8 ||
       (d.bits == 16 && !d.min_is_white))) {
    d.layout = Layout::kGray;
  } else if (gray && d.samples == 2 && d.bits == 8 && !d.min_is_white && !associated) {
    d.layout = Layout::kGrayAlpha;
  } else if (photometric == PHOTOMETRIC_RGB && (d.bits == 8 || d.bits == 16) && !associated &&
             (d.samples == 3 || d.samples == 4)) {
    d.layout = d.samples == 3 ? Layout::kRgb : Layout::kRgba;
    d.alpha = extra_count > 0 && extra != nullptr && extra[0] != EXTRASAMPLE_UNSPECIFIED;
  } else if (photometric == PHOTOMETRIC_PALETTE && d.samples == 1 && d.bits <= 8) {
    d.layout = Layout::kPalette;
  }
  return d;
}

// Every row's samples, rows without padding, from strips or tiles.
std::vector<uint8_t> read_samples(TIFF* tif, const MemoryFile& file, uint32_t width,
                                  uint32_t height) {
  const tmsize_t row_bytes = TIFFScanlineSize(tif);
  if (row_bytes <= 0) fail(file, "bad row size");
  const auto total = checked_mul(static_cast<size_t>(row_bytes), height);
  if (!total) fail(file, "image size overflows");
  std::vector<uint8_t> rows(*total);
  if (!TIFFIsTiled(tif)) {
    for (uint32_t y = 0; y < height; ++y) {
      if (TIFFReadScanline(tif, rows.data() + static_cast<size_t>(y) * row_bytes, y, 0) < 0) {
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
  const size_t pixel_bits = static_cast<size_t>(field<uint16_t>(tif, TIFFTAG_BITSPERSAMPLE, 1)) *
                            field<uint16_t>(tif, TIFFTAG_SAMPLESPERPIXEL, 1);
  for (uint32_t y = 0; y < height; y += tile_height) {
    for (uint32_t x = 0; x < width; x += tile_width) {
      if (TIFFReadTile(tif, tile.data(), x, y, 0, 0) < 0) {
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

// The sample at `index` of a row of `bits`-bit samples (MSB first).
uint32_t sample(const uint8_t* row, size_t index, uint16_t bits) {
  switch (bits) {
    case 8:
      return row[index];
    case 16: {
      uint16_t value;
      std::memcpy(&value, row + 2 * index, 2);  // native order: libtiff swapped it
      return value;
    }
    default: {
      const size_t bit = index * bits;
      return (row[bit / 8] >> (8 - bits - bit % 8)) & ((1u << bits) - 1);
    }
  }
}

// Writes one pixel of Pillow's RGB(A) value in the requested channels.
void put(uint8_t* pixel, int channels, uint8_t r, uint8_t g, uint8_t b, uint8_t a) {
  if (channels == 1) {
    pixel[0] = r;  // gray sources only; colour goes through rgb_to_gray_in_place
    return;
  }
  pixel[0] = r;
  pixel[1] = g;
  pixel[2] = b;
  if (channels == 4) pixel[3] = a;
}

void convert_samples(TIFF* tif, const MemoryFile& file, const Description& d, uint32_t width,
                     uint32_t height, int channels, std::span<uint8_t> dst) {
  const std::vector<uint8_t> rows = read_samples(tif, file, width, height);
  const size_t row_bytes = rows.size() / height;
  const bool colour =
      d.layout == Layout::kRgb || d.layout == Layout::kRgba || d.layout == Layout::kPalette;
  // Colour to gray: RGB first, then Pillow's luma.
  const int out_channels = colour && channels == 1 ? 3 : channels;
  std::vector<uint8_t> rgb;
  uint8_t* out = dst.data();
  if (out_channels != channels) {
    rgb.resize(static_cast<size_t>(width) * height * 3);
    out = rgb.data();
  }
  uint16_t *red = nullptr, *green = nullptr, *blue = nullptr;
  if (d.layout == Layout::kPalette && !TIFFGetField(tif, TIFFTAG_COLORMAP, &red, &green, &blue)) {
    fail(file, "a palette image without a colour map");
  }
  const uint32_t max = (1u << std::min<uint16_t>(d.bits, 16)) - 1;
  for (uint32_t y = 0; y < height; ++y) {
    const uint8_t* row = rows.data() + static_cast<size_t>(y) * row_bytes;
    for (uint32_t x = 0; x < width; ++x) {
      uint8_t* pixel = out + (static_cast<size_t>(y) * width + x) * out_channels;
      switch (d.layout) {
        case Layout::kGray:
        case Layout::kGrayAlpha: {
          const size_t stride = d.layout == Layout::kGray ? 1 : 2;
          uint32_t value = sample(row, x * stride, d.bits);
          uint8_t gray;
          if (d.bits == 16) {
            gray = static_cast<uint8_t>(std::min<uint32_t>(value, 255));  // "I;16": clipped
          } else {
            if (d.min_is_white) value = max - value;
            gray = static_cast<uint8_t>(value * 255 / max);  // 1, 2, 4 bits: exact multiples
          }
          const uint8_t alpha = d.layout == Layout::kGrayAlpha
                                    ? static_cast<uint8_t>(sample(row, x * 2 + 1, 8))
                                    : 255;
          put(pixel, out_channels, gray, gray, gray, alpha);
          break;
        }
        case Layout::kRgb:
        case Layout::kRgba: {
          const size_t base = static_cast<size_t>(x) * d.samples;
          const int shift = d.bits == 16 ? 8 : 0;  // Pillow keeps a 16-bit sample's high byte
          const auto at = [&](size_t i) {
            return static_cast<uint8_t>(sample(row, base + i, d.bits) >> shift);
          };
          put(pixel, out_channels, at(0), at(1), at(2), d.alpha ? at(3) : 255);
          break;
        }
        case Layout::kPalette: {
          const uint32_t index = sample(row, x, d.bits);
          put(pixel, out_channels, static_cast<uint8_t>(red[index] >> 8),
              static_cast<uint8_t>(green[index] >> 8), static_cast<uint8_t>(blue[index] >> 8), 255);
          break;
        }
        case Layout::kRgbaInterface:
          break;
      }
    }
  }
  if (out_channels != channels) {
    rgb_to_gray_in_place(rgb.data(), static_cast<size_t>(width) * height);
    std::memcpy(dst.data(), rgb.data(), static_cast<size_t>(width) * height);
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
  std::vector<uint8_t> rgb(channels == 1 ? *pixels * 3 : 0);
  for (size_t i = 0; i < *pixels; ++i) {
    const uint32_t value = raster[i];
    const auto r = static_cast<uint8_t>(TIFFGetR(value));
    const auto g = static_cast<uint8_t>(TIFFGetG(value));
    const auto b = static_cast<uint8_t>(TIFFGetB(value));
    if (channels == 1) {
      rgb[3 * i] = r, rgb[3 * i + 1] = g, rgb[3 * i + 2] = b;
    } else {
      put(dst.data() + i * channels, channels, r, g, b, static_cast<uint8_t>(TIFFGetA(value)));
    }
  }
  if (channels == 1) {
    rgb_to_gray_in_place(rgb.data(), *pixels);
    std::memcpy(dst.data(), rgb.data(), *pixels);
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
  if (description.layout == Layout::kRgbaInterface) {
    convert_rgba_interface(tif.get(), file, width, height, channels, dst);
  } else {
    convert_samples(tif.get(), file, description, width, height, channels, dst);
  }
}

}  // namespace leanloader::detail
