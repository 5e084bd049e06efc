// The EXIF orientation tag, found where each format keeps EXIF: JPEG's APP1
// "Exif" segment, PNG's eXIf chunk, WebP's EXIF chunk. Every read is bounds
// checked; anything malformed means "no orientation", as in Pillow.
#include <cstring>

#include "image/codecs.h"
#include "leanloader/core/checked_size.h"

namespace leanloader::detail {

namespace {

using Bytes = std::span<const std::byte>;

uint32_t read_u16(const std::byte* p, bool big_endian) {
  const auto a = static_cast<uint32_t>(p[0]), b = static_cast<uint32_t>(p[1]);
  return big_endian ? (a << 8) | b : (b << 8) | a;
}

uint32_t read_u32(const std::byte* p, bool big_endian) {
  const uint32_t high = read_u16(p, big_endian), low = read_u16(p + 2, big_endian);
  return big_endian ? (high << 16) | low : (low << 16) | high;
}

bool starts_with(Bytes bytes, const char* text, size_t length) {
  return bytes.size() >= length && std::memcmp(bytes.data(), text, length) == 0;
}

Bytes jpeg_exif(Bytes bytes) {
  size_t at = 2;  // after SOI
  while (range_fits(at, 4, bytes.size())) {
    if (bytes[at] != std::byte{0xFF}) return {};
    const auto marker = static_cast<uint8_t>(bytes[at + 1]);
    if (marker == 0xFF) {  // fill byte
      ++at;
      continue;
    }
    if (marker == 0xDA || marker == 0xD9) return {};  // image data: no EXIF before it
    const size_t length = read_u16(bytes.data() + at + 2, true);
    if (length < 2 || !range_fits(at + 2, length, bytes.size())) return {};
    const Bytes payload = bytes.subspan(at + 4, length - 2);
    if (marker == 0xE1 && starts_with(payload, "Exif\0\0", 6)) return payload.subspan(6);
    at += 2 + length;
  }
  return {};
}

Bytes png_exif(Bytes bytes) {
  size_t at = 8;  // after the signature
  while (range_fits(at, 12, bytes.size())) {
    const size_t length = read_u32(bytes.data() + at, true);
    if (!range_fits(at + 8, length, bytes.size())) return {};
    const Bytes type = bytes.subspan(at + 4, 4);
    if (starts_with(type, "eXIf", 4)) return bytes.subspan(at + 8, length);
    if (starts_with(type, "IEND", 4)) return {};
    at += 12 + length;
  }
  return {};
}

Bytes webp_exif(Bytes bytes) {
  size_t at = 12;  // after "RIFF" size "WEBP"
  while (range_fits(at, 8, bytes.size())) {
    const size_t length = read_u32(bytes.data() + at + 4, false);
    if (!range_fits(at + 8, length, bytes.size())) return {};
    if (starts_with(bytes.subspan(at, 4), "EXIF", 4)) {
      Bytes payload = bytes.subspan(at + 8, length);
      if (starts_with(payload, "Exif\0\0", 6)) payload = payload.subspan(6);
      return payload;
    }
    at += 8 + length + (length & 1);
  }
  return {};
}

}  // namespace

std::optional<int> tiff_orientation(Bytes tiff) {
  if (tiff.size() < 8) return std::nullopt;
  bool big_endian = false;
  if (starts_with(tiff, "MM", 2)) {
    big_endian = true;
  } else if (!starts_with(tiff, "II", 2)) {
    return std::nullopt;
  }
  if (read_u16(tiff.data() + 2, big_endian) != 42) return std::nullopt;
  const size_t ifd = read_u32(tiff.data() + 4, big_endian);
  if (!range_fits(ifd, 2, tiff.size())) return std::nullopt;
  const size_t count = read_u16(tiff.data() + ifd, big_endian);
  for (size_t i = 0; i < count; ++i) {
    const size_t entry = ifd + 2 + 12 * i;
    if (!range_fits(entry, 12, tiff.size())) return std::nullopt;
    const std::byte* p = tiff.data() + entry;
    if (read_u16(p, big_endian) != 0x0112) continue;
    const uint32_t type = read_u16(p + 2, big_endian);
    uint32_t value = 0;
    if (type == 3) {  // SHORT
      value = read_u16(p + 8, big_endian);
    } else if (type == 4) {  // LONG
      value = read_u32(p + 8, big_endian);
    } else {
      return std::nullopt;
    }
    if (value >= 1 && value <= 8) return static_cast<int>(value);
    return std::nullopt;
  }
  return std::nullopt;
}

std::optional<int> exif_orientation(Bytes bytes, ImageFormat format) {
  Bytes tiff;
  switch (format) {
    case ImageFormat::kJpeg:
      tiff = jpeg_exif(bytes);
      break;
    case ImageFormat::kPng:
      tiff = png_exif(bytes);
      break;
    case ImageFormat::kWebp:
      tiff = webp_exif(bytes);
      break;
    case ImageFormat::kUnknown:
      break;
  }
  if (tiff.empty()) return std::nullopt;
  return tiff_orientation(tiff);
}

}  // namespace leanloader::detail
