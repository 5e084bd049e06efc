#include "leanloader/image/image_decoder.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "image/image_test_util.h"
#include "leanloader/core/error.h"
#include "leanloader/image/image_format.h"
#include "test_util.h"

namespace leanloader {
namespace {

using testing::as_bytes;
using testing::encode_jpeg;
using testing::encode_png;
using testing::encode_webp_lossless;
using testing::pattern;

DecodedImage decode(const std::vector<uint8_t>& file, DecodeOptions options = {},
                    DecodeRequest request = {}) {
  const ImageInfo info = read_image_info(as_bytes(file), options);
  DecodedImage out;
  decode_image(as_bytes(file), info, options, request, out);
  return out;
}

double max_difference(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  EXPECT_EQ(a.size(), b.size());
  int worst = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    worst = std::max(worst, std::abs(int(a[i]) - int(b[i])));
  }
  return worst;
}

TEST(ImageDecoderTest, TellsFormatsByMagicBytes) {
  const auto rgb = pattern(8, 8);
  EXPECT_EQ(detect_image_format(as_bytes(encode_jpeg(rgb, 8, 8, 3))), ImageFormat::kJpeg);
  EXPECT_EQ(detect_image_format(as_bytes(encode_png(rgb.data(), rgb.size(), 8, 8, 2, 8))),
            ImageFormat::kPng);
  EXPECT_EQ(detect_image_format(as_bytes(encode_webp_lossless(rgb, 8, 8))), ImageFormat::kWebp);
  const std::vector<uint8_t> text = {'h', 'e', 'l', 'l', 'o'};
  EXPECT_EQ(detect_image_format(as_bytes(text)), ImageFormat::kUnknown);
  EXPECT_EQ(detect_image_format({}), ImageFormat::kUnknown);
}

std::vector<uint8_t> text_bytes(const std::string& text) {
  return std::vector<uint8_t>(text.begin(), text.end());
}

TEST(ImageDecoderTest, TellsPnmAndTiffByMagicBytes) {
  EXPECT_EQ(detect_image_format(as_bytes(text_bytes("P6\n1 1\n255\nabc"))), ImageFormat::kPnm);
  EXPECT_EQ(detect_image_format(as_bytes(text_bytes("P1 1 1 0"))), ImageFormat::kPnm);
  EXPECT_EQ(detect_image_format(as_bytes(text_bytes("P7\n"))), ImageFormat::kUnknown);
  EXPECT_EQ(detect_image_format(as_bytes(text_bytes("PNG?"))), ImageFormat::kUnknown);
  EXPECT_EQ(detect_image_format(as_bytes(std::vector<uint8_t>{'I', 'I', 42, 0, 8, 0, 0, 0})),
            ImageFormat::kTiff);
  EXPECT_EQ(detect_image_format(as_bytes(std::vector<uint8_t>{'M', 'M', 0, 42, 0, 0, 0, 8})),
            ImageFormat::kTiff);
}

// Pillow's PpmImagePlugin rules, byte for byte (tests/python/test_image_formats.py
// checks them against Pillow itself).
TEST(ImageDecoderTest, PnmFollowsPillowsRules) {
  DecodeOptions gray;
  gray.mode = ColorMode::kGray;
  // maxval 15: round(v / 15 * 255); a comment inside the header
  EXPECT_EQ(decode(text_bytes("P2\n# c\n3 1\n15\n0 7 15\n"), gray).pixels,
            (std::vector<uint8_t>{0, 119, 255}));
  // 16-bit gray (Pillow's mode I) clips at 255 instead of scaling
  std::vector<uint8_t> wide = text_bytes("P5\n2 1\n65535\n");
  wide.insert(wide.end(), {0x00, 0x64, 0x01, 0x00});  // 100 and 256, big-endian
  EXPECT_EQ(decode(wide, gray).pixels, (std::vector<uint8_t>{100, 255}));
  // maxval 1000 for gray: scaled to 65535 first, then clipped
  EXPECT_EQ(decode(text_bytes("P2 2 1 1000 1 2"), gray).pixels, (std::vector<uint8_t>{66, 131}));
  // packed bits, 1 is black, rows padded to a byte
  EXPECT_EQ(decode(text_bytes("P4\n3 2\n\xa0\x40"), gray).pixels,
            (std::vector<uint8_t>{0, 255, 0, 255, 0, 255}));
  // plain bits need no spaces; RGB output replicates gray
  EXPECT_EQ(decode(text_bytes("P1\n2 1\n01")).pixels,
            (std::vector<uint8_t>{255, 255, 255, 0, 0, 0}));
  // PFM (Pillow's mode F): little-endian for a negative scale, bottom row
  // first, truncated and clipped: 1.5 -> 1, 300 -> 255, -2 -> 0
  std::vector<uint8_t> pfm = text_bytes("Pf\n1 3\n-1.0\n");
  pfm.insert(pfm.end(), {0x00, 0x00, 0xc0, 0x3f, 0x00, 0x00, 0x96, 0x43, 0x00, 0x00, 0x00, 0xc0});
  EXPECT_EQ(decode(pfm, gray).pixels, (std::vector<uint8_t>{0, 255, 1}));
  // refusals: a value above maxval, a short file, a bad maxval, a PFM scale of 0
  EXPECT_THROW(decode(text_bytes("P2 2 1 5 3 9")), FormatError);
  EXPECT_THROW(decode(text_bytes("P6\n2 2\n255\nabc")), FormatError);
  EXPECT_THROW(decode(text_bytes("P5\n1 1\n0\n\x00")), FormatError);
  pfm[8] = '0';  // "-1.0" -> "-0.0"
  EXPECT_THROW(decode(pfm, gray), FormatError);
}

TEST(ImageDecoderTest, DamagedTiffAndBmpAreFormatErrors) {
  EXPECT_EQ(detect_image_format(as_bytes(text_bytes("BM...."))), ImageFormat::kBmp);
  EXPECT_THROW(decode(text_bytes("BM")), FormatError);
  // a 40-byte header announcing 2-bit pixels (Pillow refuses them too)
  std::vector<uint8_t> bmp(54, 0);
  bmp[0] = 'B', bmp[1] = 'M', bmp[10] = 54, bmp[14] = 40, bmp[18] = 1, bmp[22] = 1, bmp[26] = 1;
  bmp[28] = 2;
  EXPECT_THROW(decode(bmp), FormatError);
  bmp[28] = 24;  // 24-bit, one pixel announced, none there
  EXPECT_THROW(decode(bmp), FormatError);
  bmp.insert(bmp.end(), {10, 20, 30, 0});  // B, G, R, padding
  EXPECT_EQ(decode(bmp).pixels, (std::vector<uint8_t>{30, 20, 10}));
  EXPECT_THROW(decode({'I', 'I', 42, 0, 8, 0, 0, 0}), FormatError);
  EXPECT_THROW(decode({'M', 'M', 0, 42, 0xff, 0, 0, 0, 1, 2, 3}), FormatError);
}

// A GIF89a of `canvas_width` x `canvas_height` whose one frame (at x, y) holds
// `indices`, LZW-coded with code size 8 and a clear code before every literal
// (9-bit codes, no table), optionally with a global colour table, a
// transparent index and interlaced rows.
struct GifSpec {
  int canvas_width = 0, canvas_height = 0, x = 0, y = 0, width = 0, height = 0;
  std::vector<uint8_t> palette;  // RGB triplets, 256 of them, or none
  int transparency = -1;
  bool interlaced = false;
};

std::vector<uint8_t> encode_gif(const GifSpec& spec, const std::vector<uint8_t>& indices) {
  std::vector<uint8_t> out = {'G', 'I', 'F', '8', '9', 'a'};
  const auto u16 = [&out](int v) {
    out.push_back(static_cast<uint8_t>(v & 0xFF));
    out.push_back(static_cast<uint8_t>(v >> 8));
  };
  u16(spec.canvas_width);
  u16(spec.canvas_height);
  out.push_back(spec.palette.empty() ? 0 : 0xF7);
  out.push_back(0);
  out.push_back(0);
  out.insert(out.end(), spec.palette.begin(), spec.palette.end());
  if (spec.transparency >= 0) {
    out.insert(out.end(), {0x21, 0xF9, 4, 1, 0, 0, static_cast<uint8_t>(spec.transparency), 0});
  }
  out.push_back(',');
  u16(spec.x);
  u16(spec.y);
  u16(spec.width);
  u16(spec.height);
  out.push_back(spec.interlaced ? 0x40 : 0);
  out.push_back(8);
  std::vector<int> rows;  // file order of the rows
  const int passes[4][2] = {{0, 8}, {4, 8}, {2, 4}, {1, 2}};
  for (const auto& [start, step] : passes) {
    for (int y = start; y < spec.height; y += spec.interlaced ? step : 1) rows.push_back(y);
    if (!spec.interlaced) break;
  }
  std::vector<uint8_t> data;
  uint32_t bits = 0;
  int count = 0;
  const auto code = [&](uint32_t c) {
    bits |= c << count;
    for (count += 9; count >= 8; count -= 8, bits >>= 8) data.push_back(bits & 0xFF);
  };
  for (const int y : rows) {
    for (int x = 0; x < spec.width; ++x) {
      code(256);
      code(indices[static_cast<size_t>(y * spec.width + x)]);
    }
  }
  code(257);
  if (count > 0) data.push_back(bits & 0xFF);
  for (size_t at = 0; at < data.size(); at += 255) {
    const size_t n = std::min<size_t>(255, data.size() - at);
    out.push_back(static_cast<uint8_t>(n));
    out.insert(out.end(), data.begin() + static_cast<std::ptrdiff_t>(at),
               data.begin() + static_cast<std::ptrdiff_t>(at + n));
  }
  out.insert(out.end(), {0, ';'});
  return out;
}

TEST(ImageDecoderTest, GifsFirstFrameSitsOnItsCanvasAsPillowPutsIt) {
  EXPECT_EQ(detect_image_format(as_bytes(text_bytes("GIF87a"))), ImageFormat::kGif);
  EXPECT_EQ(detect_image_format(as_bytes(text_bytes("GIF89a"))), ImageFormat::kGif);
  EXPECT_EQ(detect_image_format(as_bytes(text_bytes("GIF90a"))), ImageFormat::kUnknown);
  std::vector<uint8_t> palette(768);
  for (size_t i = 0; i < 256; ++i) {
    palette[3 * i] = static_cast<uint8_t>(255 - i);
    palette[3 * i + 1] = static_cast<uint8_t>(i / 2);
    palette[3 * i + 2] = 7;
  }
  // a 3 x 9 frame at (1, 2) on a 5 x 10 canvas, rows interlaced (4 passes)
  GifSpec spec{5, 10, 1, 2, 3, 9, palette, -1, true};
  std::vector<uint8_t> indices(27);
  for (size_t i = 0; i < indices.size(); ++i) indices[i] = static_cast<uint8_t>(10 + i);
  const auto file = encode_gif(spec, indices);
  const DecodedImage rgb = decode(file);
  ASSERT_EQ(rgb.width, 5);
  ASSERT_EQ(rgb.height, 11);  // the frame reaches past the screen: the canvas grows
  const auto at = [&](const DecodedImage& image, int x, int y) {
    return &image.pixels[static_cast<size_t>((y * image.width + x) * image.channels)];
  };
  for (int y = 0; y < 11; ++y) {
    for (int x = 0; x < 5; ++x) {
      const bool inside = x >= 1 && x < 4 && y >= 2;
      const uint8_t index = inside ? indices[static_cast<size_t>((y - 2) * 3 + x - 1)] : 0;
      const uint8_t* pixel = at(rgb, x, y);
      ASSERT_EQ(pixel[0], 255 - index) << x << "," << y;
      ASSERT_EQ(pixel[1], index / 2) << x << "," << y;
      ASSERT_EQ(pixel[2], 7) << x << "," << y;
    }
  }
  // transparent index 12: the canvas is filled with it, RGBA's alpha is 0 there
  spec.transparency = 12;
  const DecodedImage rgba = decode(encode_gif(spec, indices), {.mode = ColorMode::kRGBA});
  EXPECT_EQ(at(rgba, 0, 0)[0], 255 - 12);
  EXPECT_EQ(at(rgba, 0, 0)[3], 0);
  EXPECT_EQ(at(rgba, 3, 2)[3], 0);    // index 12 inside the frame
  EXPECT_EQ(at(rgba, 1, 2)[3], 255);  // index 10
  // no colour table: gray, the index is the value
  spec.palette.clear();
  spec.transparency = -1;
  const DecodedImage gray = decode(encode_gif(spec, indices), {.mode = ColorMode::kGray});
  EXPECT_EQ(at(gray, 1, 3)[0], indices[3]);
  EXPECT_EQ(at(gray, 0, 3)[0], 0);
  // the stream cut inside the frame's data, an LZW code past the table
  auto cut = file;
  cut.resize(cut.size() - 12);
  EXPECT_THROW(decode(cut), FormatError);
  // header 13, colour table 768, descriptor 10, code size 1, block length 1
  const size_t data = 13 + 768 + 10 + 1 + 1;
  auto broken = file;
  broken[data + 2] = 0xFF;  // the second code (bits 9-17) above the clear code after a clear
  try {
    decode(broken);
    ADD_FAILURE() << "decoded";
  } catch (const FormatError& error) {
    EXPECT_NE(std::string(error.what()).find("broken data stream"), std::string::npos)
        << error.what();
  }
}

TEST(ImageDecoderTest, TellsAFilesFormatByItsFirstBytes) {
  const testing::TempDir dir;
  const auto rgb = pattern(8, 8);
  const auto png = encode_png(rgb.data(), rgb.size(), 8, 8, 2, 8);
  const std::string named_bmp = dir.file("really_a_png.bmp");
  std::ofstream(named_bmp, std::ios::binary)
      .write(reinterpret_cast<const char*>(png.data()), static_cast<std::streamsize>(png.size()));
  EXPECT_EQ(detect_image_file_format(named_bmp), ImageFormat::kPng);
  const std::string short_file = dir.file("short.jpg");
  std::ofstream(short_file) << "GI";
  EXPECT_EQ(detect_image_file_format(short_file), ImageFormat::kUnknown);
  EXPECT_THROW(detect_image_file_format(dir.file("missing.png")), IoError);
}

TEST(ImageDecoderTest, PngColorTypesDecodeExactly) {
  const int w = 13, h = 7;
  const auto rgb = pattern(w, h, 3);
  auto decoded = decode(encode_png(rgb.data(), rgb.size(), w, h, SPNG_COLOR_TYPE_TRUECOLOR, 8));
  EXPECT_EQ(decoded.width, w);
  EXPECT_EQ(decoded.height, h);
  EXPECT_EQ(decoded.channels, 3);
  EXPECT_EQ(decoded.pixels, rgb);

  // RGBA: alpha dropped for RGB, kept for RGBA.
  const auto rgba = pattern(w, h, 4);
  const auto rgba_png =
      encode_png(rgba.data(), rgba.size(), w, h, SPNG_COLOR_TYPE_TRUECOLOR_ALPHA, 8);
  decoded = decode(rgba_png);
  for (size_t i = 0; i < size_t(w * h); ++i) {
    for (int c = 0; c < 3; ++c) ASSERT_EQ(decoded.pixels[i * 3 + c], rgba[i * 4 + c]);
  }
  DecodeOptions keep_alpha;
  keep_alpha.mode = ColorMode::kRGBA;
  EXPECT_EQ(decode(rgba_png, keep_alpha).pixels, rgba);

  // Gray: replicated for RGB, kept for gray.
  const auto gray = pattern(w, h, 1);
  const auto gray_png = encode_png(gray.data(), gray.size(), w, h, SPNG_COLOR_TYPE_GRAYSCALE, 8);
  decoded = decode(gray_png);
  for (size_t i = 0; i < size_t(w * h); ++i) ASSERT_EQ(decoded.pixels[i * 3 + 2], gray[i]);
  DecodeOptions keep_gray;
  keep_gray.mode = ColorMode::kGray;
  EXPECT_EQ(decode(gray_png, keep_gray).pixels, gray);

  // 16-bit RGB keeps the high byte.
  std::vector<uint16_t> wide(rgb.size());  // spng takes host-endian samples
  for (size_t i = 0; i < rgb.size(); ++i) wide[i] = uint16_t(rgb[i] << 8 | 0xAB);
  EXPECT_EQ(
      decode(encode_png(wide.data(), wide.size() * 2, w, h, SPNG_COLOR_TYPE_TRUECOLOR, 16)).pixels,
      rgb);

  // Palette.
  std::vector<uint8_t> palette;
  for (int i = 0; i < 4; ++i) palette.insert(palette.end(), {uint8_t(i * 60), uint8_t(255 - i), 7});
  std::vector<uint8_t> indices(size_t(w * h));
  for (size_t i = 0; i < indices.size(); ++i) indices[i] = uint8_t(i % 4);
  decoded =
      decode(encode_png(indices.data(), indices.size(), w, h, SPNG_COLOR_TYPE_INDEXED, 8, palette));
  for (size_t i = 0; i < indices.size(); ++i) {
    ASSERT_EQ(decoded.pixels[i * 3], palette[indices[i] * 3]);
    ASSERT_EQ(decoded.pixels[i * 3 + 1], palette[indices[i] * 3 + 1]);
  }
}

TEST(ImageDecoderTest, WebpLosslessDecodesExactly) {
  const auto rgb = pattern(31, 17);
  const auto file = encode_webp_lossless(rgb, 31, 17);
  const auto decoded = decode(file);
  EXPECT_EQ(decoded.width, 31);
  EXPECT_EQ(decoded.pixels, rgb);
  // A region (odd offsets) is cropped by libwebp, exactly.
  const PixelBox box{5, 3, 19, 11};
  const auto part = decode(file, {}, {box, 0, 0});
  ASSERT_EQ(part.width, box.width);
  ASSERT_EQ(part.height, box.height);
  for (int64_t y = 0; y < box.height; ++y) {
    for (int64_t x = 0; x < box.width * 3; ++x) {
      ASSERT_EQ(part.pixels[size_t(y * box.width * 3 + x)],
                rgb[size_t((y + box.y) * 31 * 3 + box.x * 3 + x)]);
    }
  }
}

TEST(ImageDecoderTest, JpegDecodesCloseToTheSource) {
  const int w = 64, h = 48;
  std::vector<uint8_t> rgb(size_t(w * h * 3));  // smooth: chroma subsampling loses little
  for (size_t i = 0; i < rgb.size(); ++i) rgb[i] = uint8_t((i / 3 % w) * 2 + (i % 3) * 40);
  for (const bool progressive : {false, true}) {
    const auto decoded = decode(encode_jpeg(rgb, w, h, 3, 100, progressive));
    EXPECT_EQ(decoded.width, w);
    EXPECT_EQ(decoded.height, h);
    double error = 0;
    for (size_t i = 0; i < rgb.size(); ++i) error += std::abs(int(decoded.pixels[i]) - int(rgb[i]));
    EXPECT_LT(error / double(rgb.size()), 2.0);
  }
}

TEST(ImageDecoderTest, JpegRegionEqualsTheSameRegionOfAFullDecode) {
  const int w = 200, h = 150;
  for (const bool progressive : {false, true}) {
    for (const int channels : {3, 1}) {
      const auto file = encode_jpeg(pattern(w, h, channels), w, h, channels, 90, progressive);
      const DecodedImage full = decode(file);
      for (const PixelBox box : {PixelBox{37, 53, 101, 61}, PixelBox{0, 0, 17, 9},
                                 PixelBox{32, 16, 168, 134}, PixelBox{199, 149, 1, 1}}) {
        const DecodedImage part = decode(file, {}, {box, 0, 0});
        ASSERT_EQ(part.width, box.width);
        ASSERT_EQ(part.height, box.height);
        std::vector<uint8_t> expected;
        for (int64_t y = box.y; y < box.y + box.height; ++y) {
          const auto* row = full.pixels.data() + (y * w + box.x) * 3;
          expected.insert(expected.end(), row, row + box.width * 3);
        }
        EXPECT_EQ(max_difference(part.pixels, expected), 0)
            << "progressive " << progressive << " channels " << channels << " box " << box.x << ","
            << box.y;
      }
    }
  }
}

TEST(ImageDecoderTest, JpegDctScalingKeepsTheRegionAtLeastTheAskedSize) {
  const int w = 400, h = 320;
  const auto file = encode_jpeg(pattern(w, h), w, h, 3, 90);
  const DecodedImage quarter = decode(file, {}, {{0, 0, 0, 0}, 100, 80});
  EXPECT_EQ(quarter.scale, 2.0 / 8.0);
  EXPECT_EQ(quarter.width, 100);
  EXPECT_EQ(quarter.height, 80);
  const DecodedImage region = decode(file, {}, {{40, 24, 200, 160}, 60, 60});
  EXPECT_EQ(region.scale, 3.0 / 8.0);
  EXPECT_GE(region.width, 75);
  EXPECT_GE(region.height, 60);
  EXPECT_LE(region.width, 76);
  EXPECT_LE(region.height, 61);
}

TEST(ImageDecoderTest, RejectsOversizedImagesFromTheHeader) {
  const auto rgb = pattern(100, 100);
  const auto file = encode_png(rgb.data(), rgb.size(), 100, 100, SPNG_COLOR_TYPE_TRUECOLOR, 8);
  DecodeOptions options;
  options.max_pixels = 6000;  // as Pillow: over it, a warning; over twice it, refused
  EXPECT_TRUE(read_image_info(as_bytes(file), options).over_pixel_limit);
  options.max_pixels = 10000;
  EXPECT_FALSE(read_image_info(as_bytes(file), options).over_pixel_limit);
  options.max_pixels = 4999;
  try {
    read_image_info(as_bytes(file), options);
    FAIL() << "no error";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("exceed twice the limit of 4999"), std::string::npos);
  }
  // A PNG header claiming 100000 x 100000 pixels: refused before decoding.
  auto bomb = file;
  const uint8_t big[4] = {0x00, 0x01, 0x86, 0xA0};
  std::copy(big, big + 4, bomb.begin() + 16);
  std::copy(big, big + 4, bomb.begin() + 20);
  EXPECT_THROW(read_image_info(as_bytes(bomb), {}), FormatError);
}

TEST(ImageDecoderTest, BadBytesAreFormatErrors) {
  const auto rgb = pattern(64, 64);
  const auto jpeg = encode_jpeg(rgb, 64, 64, 3);
  const auto png = encode_png(rgb.data(), rgb.size(), 64, 64, SPNG_COLOR_TYPE_TRUECOLOR, 8);
  const auto webp = encode_webp_lossless(rgb, 64, 64);
  for (const auto* file : {&jpeg, &png, &webp}) {
    const std::vector<uint8_t> truncated(file->begin(), file->begin() + file->size() * 2 / 3);
    EXPECT_THROW(decode(truncated), FormatError);
    std::vector<uint8_t> corrupt = *file;
    for (size_t i = corrupt.size() / 3; i < corrupt.size() * 2 / 3; i += 7) corrupt[i] ^= 0x5A;
    EXPECT_THROW(decode(corrupt), FormatError);
  }
  EXPECT_THROW(decode({}), FormatError);
  EXPECT_THROW(decode({'n', 'o', 't', ' ', 'a', 'n', ' ', 'i', 'm', 'a', 'g', 'e'}), FormatError);
}

TEST(ImageDecoderTest, CorruptJpegDataIsDecodedAsPillowDoesUnlessStrict) {
  const auto rgb = pattern(64, 64);
  auto file = encode_jpeg(rgb, 64, 64, 3);
  // Bytes between markers: libjpeg-turbo warns ("Corrupt JPEG data: 2
  // extraneous bytes before marker 0xdb") and goes on, as Pillow does.
  const size_t app0_end = 4 + (size_t(file[4]) << 8 | file[5]);  // SOI, APP0
  file.insert(file.begin() + std::ptrdiff_t(app0_end), {0x12, 0x34});
  const DecodedImage decoded = decode(file);
  EXPECT_EQ(decoded.width, 64);
  EXPECT_TRUE(decoded.corrupt_data);
  EXPECT_FALSE(decode(encode_jpeg(rgb, 64, 64, 3)).corrupt_data);
  DecodeOptions strict;
  strict.accept_corrupt_jpeg = false;
  EXPECT_THROW(decode(file, strict), FormatError);
}

// Where the damage lies below the region a crop asks for, the rows are
// still read: the outcome is the whole file's whatever the region.
TEST(ImageDecoderTest, ARegionDecodeHasTheWholeFilesOutcome) {
  const int w = 64, h = 256;
  const auto rgb = pattern(w, h);
  const auto file = encode_jpeg(rgb, w, h, 3);
  const std::vector<uint8_t> truncated(file.begin(), file.begin() + file.size() * 9 / 10);
  // A stray marker in the last rows' entropy data ("Corrupt JPEG data:
  // premature end of data segment"): decodable, with a warning.
  std::vector<uint8_t> damaged = file;
  damaged.insert(damaged.end() - 40, {0xFF, 0xD3});
  DecodeOptions strict;
  strict.accept_corrupt_jpeg = false;
  for (const PixelBox box :
       {PixelBox{0, 0, 16, 16}, PixelBox{8, 40, 32, 32}, PixelBox{0, 0, w, h}}) {
    for (const int64_t min_side : {int64_t{0}, int64_t{4}}) {
      const DecodeRequest request{box, min_side, min_side};
      EXPECT_THROW(decode(truncated, {}, request), FormatError) << box.y;
      EXPECT_THROW(decode(truncated, strict, request), FormatError) << box.y;
      EXPECT_TRUE(decode(damaged, {}, request).corrupt_data) << box.y;
      EXPECT_THROW(decode(damaged, strict, request), FormatError) << box.y;
      EXPECT_FALSE(decode(file, strict, request).corrupt_data) << box.y;
    }
  }
}

TEST(ImageDecoderTest, ExifOrientationTurnsTheImage) {
  const int w = 32, h = 16;
  std::vector<uint8_t> gray(size_t(w * h));
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) gray[size_t(y * w + x)] = uint8_t(x < 8 && y < 8 ? 250 : 10);
  }
  const auto file = encode_jpeg(gray, w, h, 1, 100, false, testing::exif_orientation_block(6));
  DecodeOptions keep_gray;
  keep_gray.mode = ColorMode::kGray;
  const DecodedImage stored = decode(file, keep_gray);
  EXPECT_EQ(stored.width, w);
  DecodeOptions oriented = keep_gray;
  oriented.exif_orientation = true;
  const ImageInfo info = read_image_info(as_bytes(file), oriented);
  EXPECT_EQ(info.orientation, 6);
  EXPECT_EQ(info.width, h);
  EXPECT_EQ(info.height, w);
  const DecodedImage turned = decode(file, oriented);
  ASSERT_EQ(turned.width, h);
  ASSERT_EQ(turned.height, w);
  // Rotated 90 degrees clockwise: the bright top-left corner is now top-right.
  EXPECT_GT(turned.pixels[size_t(h - 2)], 200);
  EXPECT_LT(turned.pixels[0], 60);
  // A region of the turned image equals the same region of the whole.
  const PixelBox box{3, 5, 9, 20};
  const DecodedImage part = decode(file, oriented, {box, 0, 0});
  ASSERT_EQ(part.width, box.width);
  ASSERT_EQ(part.height, box.height);
  for (int64_t y = 0; y < box.height; ++y) {
    for (int64_t x = 0; x < box.width; ++x) {
      ASSERT_NEAR(part.pixels[size_t(y * box.width + x)],
                  turned.pixels[size_t((y + box.y) * h + x + box.x)], 1);
    }
  }
}

TEST(ImageDecoderTest, RegionsOfOrientedImagesEqualTheOrientedWhole) {
  const int w = 48, h = 32;
  const auto rgb = pattern(w, h);
  for (int orientation = 1; orientation <= 8; ++orientation) {
    const auto file =
        encode_jpeg(rgb, w, h, 3, 95, false, testing::exif_orientation_block(orientation));
    DecodeOptions oriented;
    oriented.exif_orientation = true;
    const DecodedImage whole = decode(file, oriented);
    for (const PixelBox box : {PixelBox{3, 5, 9, 20}, PixelBox{0, 0, 1, 1},
                               PixelBox{7, 2, whole.width - 7, whole.height - 2}}) {
      const DecodedImage part = decode(file, oriented, {box, 0, 0});
      ASSERT_EQ(part.width, box.width) << orientation;
      ASSERT_EQ(part.height, box.height) << orientation;
      for (int64_t y = 0; y < box.height; ++y) {
        for (int64_t x = 0; x < box.width * 3; ++x) {
          ASSERT_EQ(part.pixels[size_t(y * box.width * 3 + x)],
                    whole.pixels[size_t((y + box.y) * whole.width * 3 + box.x * 3 + x)])
              << "orientation " << orientation << " box " << box.x << "," << box.y;
        }
      }
    }
  }
}

}  // namespace
}  // namespace leanloader
