// The orientation Pillow's ImageOps.exif_transpose applies
// (Image.getexif()): the EXIF orientation tag where each format keeps EXIF
// (JPEG's APP1 "Exif" segment, PNG's eXIf chunk or ImageMagick's "Raw
// profile type exif" text chunk, WebP's EXIF chunk); when EXIF has no
// orientation tag, the first `tiff:Orientation="N"` (or `>N`) of the XMP
// packet (JPEG's APP1 XMP segment, PNG's "XML:com.adobe.xmp" text chunk,
// WebP's "XMP " chunk). Every read is bounds checked; anything malformed
// means "no orientation", as in Pillow.
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "image/byte_order.h"
#include "image/codecs.h"
#include "io/zlib_inflate.h"
#include "leanloader/core/checked_size.h"

namespace leanloader::detail {

namespace {

using Bytes = std::span<const std::byte>;

bool starts_with(Bytes bytes, const char* text, size_t length) {
  return bytes.size() >= length && std::memcmp(bytes.data(), text, length) == 0;
}

// Pillow's Exif.load drops up to two leading "Exif\0\0" from what it is
// given (some writers repeat the prefix).
Bytes without_exif_prefixes(Bytes exif, int at_most) {
  for (int i = 0; i < at_most && starts_with(exif, "Exif\0\0", 6); ++i) exif = exif.subspan(6);
  return exif;
}

// What a file says of its orientation: its EXIF (a TIFF structure) and its
// XMP packet, either possibly empty. `owned` keeps bytes inflated or decoded
// from text chunks.
struct Metadata {
  Bytes exif;
  Bytes xmp;
  std::vector<std::byte> owned_exif;
  std::vector<std::byte> owned_xmp;
};

Metadata jpeg_metadata(Bytes bytes) {
  Metadata found;
  static constexpr char kXmp[] = "http://ns.adobe.com/xap/1.0/";  // then a NUL
  size_t at = 2;                                                  // after SOI
  while (range_fits(at, 4, bytes.size())) {
    if (bytes[at] != std::byte{0xFF}) break;
    const auto marker = static_cast<uint8_t>(bytes[at + 1]);
    if (marker == 0xFF) {  // fill byte
      ++at;
      continue;
    }
    if (marker == 0xDA || marker == 0xD9) break;  // image data: metadata comes before it
    const size_t length = load_u16(bytes.data() + at + 2, true);
    if (length < 2 || !range_fits(at + 2, length, bytes.size())) break;
    const Bytes payload = bytes.subspan(at + 4, length - 2);
    if (marker == 0xE1 && found.exif.empty() && starts_with(payload, "Exif\0\0", 6)) {
      found.exif = without_exif_prefixes(payload, 2);  // (the first, as Pillow's IFD0)
    } else if (marker == 0xE1 && starts_with(payload, kXmp, sizeof(kXmp))) {
      found.xmp = payload.subspan(sizeof(kXmp));  // (the last, as Pillow's info["xmp"])
    }
    at += 2 + length;
  }
  return found;
}

// A PNG text chunk's keyword and text (tEXt; zTXt and compressed iTXt
// inflated, at most 1 MiB as Pillow's MAX_TEXT_CHUNK), or nullopt.
std::optional<std::pair<std::string_view, std::vector<std::byte>>> png_text(Bytes type,
                                                                            Bytes data) {
  const auto* begin = reinterpret_cast<const char*>(data.data());
  const std::string_view all(begin, data.size());
  const size_t nul = all.find('\0');
  if (nul == std::string_view::npos) return std::nullopt;
  const std::string_view keyword = all.substr(0, nul);
  Bytes text = data.subspan(nul + 1);
  bool compressed = false;
  if (starts_with(type, "zTXt", 4)) {
    if (text.empty() || text[0] != std::byte{0}) return std::nullopt;
    text = text.subspan(1);
    compressed = true;
  } else if (starts_with(type, "iTXt", 4)) {
    if (text.size() < 2) return std::nullopt;
    compressed = text[0] != std::byte{0};
    if (compressed && text[1] != std::byte{0}) return std::nullopt;
    text = text.subspan(2);
    for (int field = 0; field < 2; ++field) {  // language tag, translated keyword
      const auto* p = reinterpret_cast<const char*>(text.data());
      const size_t end = std::string_view(p, text.size()).find('\0');
      if (end == std::string_view::npos) return std::nullopt;
      text = text.subspan(end + 1);
    }
  } else if (!starts_with(type, "tEXt", 4)) {
    return std::nullopt;
  }
  std::vector<std::byte> value;
  if (!compressed) {
    value.assign(text.begin(), text.end());
    return std::make_pair(keyword, std::move(value));
  }
  value.resize(size_t{1} << 20);
  size_t produced = 0;
  if (zlib_inflate(text, value, produced) != InflateResult::kOk) return std::nullopt;
  value.resize(produced);
  return std::make_pair(keyword, std::move(value));
}

// ImageMagick's "Raw profile type exif": "\nexif\n   <size>\n<hex lines>";
// Pillow reads the hex digits after the third line break.
std::vector<std::byte> raw_profile_bytes(const std::vector<std::byte>& text) {
  std::vector<std::byte> out;
  int breaks = 0;
  int high = -1;
  for (const std::byte byte : text) {
    const char c = static_cast<char>(byte);
    if (breaks < 3) {
      if (c == '\n') ++breaks;
      continue;
    }
    int digit = -1;
    if (c >= '0' && c <= '9') digit = c - '0';
    if (c >= 'a' && c <= 'f') digit = c - 'a' + 10;
    if (c >= 'A' && c <= 'F') digit = c - 'A' + 10;
    if (digit < 0) {
      if (c == '\n' || c == ' ') continue;
      return {};  // Pillow's bytes.fromhex fails: no EXIF
    }
    if (high < 0) {
      high = digit;
    } else {
      out.push_back(static_cast<std::byte>(high * 16 + digit));
      high = -1;
    }
  }
  if (high >= 0) return {};
  return out;
}

Metadata png_metadata(Bytes bytes) {
  Metadata found;
  size_t at = 8;  // after the signature
  while (range_fits(at, 12, bytes.size())) {
    const size_t length = load_u32(bytes.data() + at, true);
    if (!range_fits(at + 8, length, bytes.size())) break;
    const Bytes type = bytes.subspan(at + 4, 4);
    const Bytes data = bytes.subspan(at + 8, length);
    if (starts_with(type, "eXIf", 4)) {
      found.exif = without_exif_prefixes(data, 1);  // (Pillow prepends one, drops two)
      found.owned_exif.clear();
    } else if (auto text = png_text(type, data)) {
      if (text->first == "XML:com.adobe.xmp") {
        found.owned_xmp = std::move(text->second);
        found.xmp = found.owned_xmp;
      } else if (text->first == "Raw profile type exif" && found.exif.empty()) {
        found.owned_exif = raw_profile_bytes(text->second);
        found.exif = without_exif_prefixes(found.owned_exif, 2);
      }
    } else if (starts_with(type, "IEND", 4)) {
      break;
    }
    at += 12 + length;
  }
  return found;
}

Metadata webp_metadata(Bytes bytes) {
  Metadata found;
  size_t at = 12;  // after "RIFF" size "WEBP"
  while (range_fits(at, 8, bytes.size())) {
    const size_t length = load_u32(bytes.data() + at + 4, false);
    if (!range_fits(at + 8, length, bytes.size())) break;
    const Bytes payload = bytes.subspan(at + 8, length);
    if (starts_with(bytes.subspan(at, 4), "EXIF", 4)) {
      found.exif = without_exif_prefixes(payload, 2);
    } else if (starts_with(bytes.subspan(at, 4), "XMP ", 4)) {
      found.xmp = payload;
    }
    at += 8 + length + (length & 1);
  }
  return found;
}

// Pillow's re.search(r'tiff:Orientation(="|>)([0-9])', xmp).
std::optional<int> xmp_orientation(Bytes xmp) {
  const std::string_view text(reinterpret_cast<const char*>(xmp.data()), xmp.size());
  constexpr std::string_view kTag = "tiff:Orientation";
  for (size_t at = text.find(kTag); at != std::string_view::npos; at = text.find(kTag, at + 1)) {
    size_t value = at + kTag.size();
    if (text.substr(value, 2) == "=\"") {
      value += 2;
    } else if (text.substr(value, 1) == ">") {
      value += 1;
    } else {
      continue;
    }
    if (value < text.size() && text[value] >= '0' && text[value] <= '9') return text[value] - '0';
  }
  return std::nullopt;
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
  if (load_u16(tiff.data() + 2, big_endian) != 42) return std::nullopt;
  const size_t ifd = load_u32(tiff.data() + 4, big_endian);
  if (!range_fits(ifd, 2, tiff.size())) return std::nullopt;
  const size_t count = load_u16(tiff.data() + ifd, big_endian);
  for (size_t i = 0; i < count; ++i) {
    const size_t entry = ifd + 2 + 12 * i;
    if (!range_fits(entry, 12, tiff.size())) return std::nullopt;
    const std::byte* p = tiff.data() + entry;
    if (load_u16(p, big_endian) != 0x0112) continue;
    const uint32_t type = load_u16(p + 2, big_endian);
    uint32_t value = 0;
    if (type == 3) {  // SHORT
      value = load_u16(p + 8, big_endian);
    } else if (type == 4) {  // LONG
      value = load_u32(p + 8, big_endian);
    }
    // Present, even with a value Pillow's exif_transpose ignores (then no
    // turn, and XMP is not asked).
    return value >= 1 && value <= 8 ? static_cast<int>(value) : 1;
  }
  return std::nullopt;
}

std::optional<int> exif_orientation(Bytes bytes, ImageFormat format) {
  Metadata metadata;
  switch (format) {
    case ImageFormat::kJpeg:
      metadata = jpeg_metadata(bytes);
      break;
    case ImageFormat::kPng:
      metadata = png_metadata(bytes);
      break;
    case ImageFormat::kWebp:
      metadata = webp_metadata(bytes);
      break;
    case ImageFormat::kTiff:
      // The file's own first IFD holds the tag (Pillow's getexif() of a TIFF).
      return tiff_orientation(bytes);
    case ImageFormat::kPnm:
    case ImageFormat::kBmp:
    case ImageFormat::kGif:
    case ImageFormat::kUnknown:
      break;
  }
  if (!metadata.exif.empty()) {
    if (const std::optional<int> tagged = tiff_orientation(metadata.exif)) return tagged;
  }
  if (metadata.xmp.empty()) return std::nullopt;
  const std::optional<int> from_xmp = xmp_orientation(metadata.xmp);
  if (from_xmp && *from_xmp >= 1 && *from_xmp <= 8) return from_xmp;
  return from_xmp ? std::optional<int>(1) : std::nullopt;
}

}  // namespace leanloader::detail
