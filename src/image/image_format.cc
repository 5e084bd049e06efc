#include "leanloader/image/image_format.h"

#include <cstring>
#include <vector>

#include "io/file_io.h"

namespace leanloader {

ImageFormat detect_image_format(std::span<const std::byte> bytes) noexcept {
  const auto* b = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  if (n >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF) return ImageFormat::kJpeg;
  static constexpr unsigned char kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  if (n >= 8 && std::memcmp(b, kPng, 8) == 0) return ImageFormat::kPng;
  if (n >= 12 && std::memcmp(b, "RIFF", 4) == 0 && std::memcmp(b + 8, "WEBP", 4) == 0) {
    return ImageFormat::kWebp;
  }
  if (n >= 4 && ((b[0] == 'I' && b[1] == 'I' && (b[2] == 42 || b[2] == 43) && b[3] == 0) ||
                 (b[0] == 'M' && b[1] == 'M' && b[2] == 0 && (b[3] == 42 || b[3] == 43)))) {
    return ImageFormat::kTiff;
  }
  if (n >= 3 && b[0] == 'P' && ((b[1] >= '1' && b[1] <= '6') || b[1] == 'f' || b[1] == 'F') &&
      std::strchr(" \t\n\v\f\r", b[2]) != nullptr && b[2] != 0) {
    return ImageFormat::kPnm;
  }
  if (n >= 2 && b[0] == 'B' && b[1] == 'M') return ImageFormat::kBmp;
  if (n >= 6 && (std::memcmp(b, "GIF87a", 6) == 0 || std::memcmp(b, "GIF89a", 6) == 0)) {
    return ImageFormat::kGif;
  }
  return ImageFormat::kUnknown;
}

ImageFormat detect_image_file_format(const std::string& path) {
  const std::vector<std::byte> head = detail::read_file_prefix(path, 12);
  return detect_image_format(head);
}

std::string_view image_format_name(ImageFormat format) noexcept {
  switch (format) {
    case ImageFormat::kJpeg:
      return "JPEG";
    case ImageFormat::kPng:
      return "PNG";
    case ImageFormat::kWebp:
      return "WebP";
    case ImageFormat::kPnm:
      return "PPM";
    case ImageFormat::kTiff:
      return "TIFF";
    case ImageFormat::kBmp:
      return "BMP";
    case ImageFormat::kGif:
      return "GIF";
    case ImageFormat::kUnknown:
      break;
  }
  return "unknown";
}

}  // namespace leanloader
