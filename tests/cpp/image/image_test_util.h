// Test images written by the codec libraries themselves (libjpeg-turbo,
// libspng, libwebp encoders), so that decoder tests need no fixtures.
#pragma once

#include <spng.h>
#include <webp/encode.h>

#include <cstdio>
// jpeglib.h needs FILE and size_t first.
#include <jpeglib.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace leanloader::testing {

inline std::span<const std::byte> as_bytes(const std::vector<uint8_t>& data) {
  return {reinterpret_cast<const std::byte*>(data.data()), data.size()};
}

// A smooth RGB test pattern (gradients and a diagonal wave).
inline std::vector<uint8_t> pattern(int width, int height, int channels = 3) {
  std::vector<uint8_t> pixels(static_cast<size_t>(width) * height * channels);
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      for (int c = 0; c < channels; ++c) {
        const int value =
            (x * 255 / std::max(1, width - 1) * (c + 1) + y * 3 + (x + y) % 17 * c) % 256;
        pixels[(static_cast<size_t>(y) * width + x) * channels + c] = static_cast<uint8_t>(value);
      }
    }
  }
  return pixels;
}

// JPEG of interleaved RGB (3) or gray (1) pixels. `extra` is written as an
// APP1 marker payload when not empty (EXIF).
inline std::vector<uint8_t> encode_jpeg(const std::vector<uint8_t>& pixels, int width, int height,
                                        int channels, int quality = 95, bool progressive = false,
                                        const std::vector<uint8_t>& app1 = {}) {
  jpeg_compress_struct cinfo;
  jpeg_error_mgr errors;
  cinfo.err = jpeg_std_error(&errors);
  jpeg_create_compress(&cinfo);
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&cinfo, &buffer, &size);
  cinfo.image_width = static_cast<JDIMENSION>(width);
  cinfo.image_height = static_cast<JDIMENSION>(height);
  cinfo.input_components = channels;
  cinfo.in_color_space = channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, quality, TRUE);
  if (progressive) jpeg_simple_progression(&cinfo);
  jpeg_start_compress(&cinfo, TRUE);
  if (!app1.empty()) {
    jpeg_write_marker(&cinfo, JPEG_APP0 + 1, app1.data(), static_cast<unsigned>(app1.size()));
  }
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(pixels.data()) +
                   static_cast<size_t>(cinfo.next_scanline) * width * channels;
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  std::vector<uint8_t> out(buffer, buffer + size);
  free(buffer);
  return out;
}

// PNG through spng's encoder: `pixels` in PNG's own layout for the color
// type and bit depth (big-endian 16-bit samples, packed sub-byte rows).
inline std::vector<uint8_t> encode_png(const void* pixels, size_t bytes, int width, int height,
                                       uint8_t color_type, uint8_t bit_depth,
                                       const std::vector<uint8_t>& palette_rgb = {}) {
  spng_ctx* ctx = spng_ctx_new(SPNG_CTX_ENCODER);
  spng_set_option(ctx, SPNG_ENCODE_TO_BUFFER, 1);
  spng_ihdr ihdr{};
  ihdr.width = static_cast<uint32_t>(width);
  ihdr.height = static_cast<uint32_t>(height);
  ihdr.color_type = color_type;
  ihdr.bit_depth = bit_depth;
  spng_set_ihdr(ctx, &ihdr);
  if (!palette_rgb.empty()) {
    spng_plte plte{};
    plte.n_entries = static_cast<uint32_t>(palette_rgb.size() / 3);
    for (uint32_t i = 0; i < plte.n_entries; ++i) {
      plte.entries[i] = {palette_rgb[3 * i], palette_rgb[3 * i + 1], palette_rgb[3 * i + 2], 0};
    }
    spng_set_plte(ctx, &plte);
  }
  const int status = spng_encode_image(ctx, pixels, bytes, SPNG_FMT_PNG, SPNG_ENCODE_FINALIZE);
  if (status != 0) throw std::runtime_error(std::string("spng: ") + spng_strerror(status));
  size_t size = 0;
  int error = 0;
  auto* data = static_cast<uint8_t*>(spng_get_png_buffer(ctx, &size, &error));
  std::vector<uint8_t> out(data, data + size);
  free(data);
  spng_ctx_free(ctx);
  return out;
}

inline std::vector<uint8_t> encode_webp_lossless(const std::vector<uint8_t>& rgb, int width,
                                                 int height) {
  uint8_t* output = nullptr;
  const size_t size = WebPEncodeLosslessRGB(rgb.data(), width, height, width * 3, &output);
  std::vector<uint8_t> out(output, output + size);
  WebPFree(output);
  return out;
}

// A TIFF (EXIF) block with only the orientation tag, little-endian.
inline std::vector<uint8_t> exif_orientation_block(int orientation) {
  std::vector<uint8_t> block = {
      'E',  'x',  'i', 'f', 0, 0, 'I', 'I', 42,
      0,    8,    0,   0,   0,  // header
      1,    0,                  // 1 entry
      0x12, 0x01, 3,   0,   1, 0, 0,   0,   static_cast<uint8_t>(orientation),
      0,    0,    0,        // SHORT
      0,    0,    0,   0};  // next IFD
  return block;
}

}  // namespace leanloader::testing
