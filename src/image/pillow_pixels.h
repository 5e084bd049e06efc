// Pillow's per-pixel conversions (libImaging/Convert.c), shared by the codecs
// that decode samples themselves and then convert them as Pillow's
// Image.convert() would. Internal.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

namespace leanloader::detail {

inline uint8_t clip8(int value) { return static_cast<uint8_t>(std::clamp(value, 0, 255)); }

// Pillow's MULDIV255: a * b / 255, rounded.
inline int muldiv255(int a, int b) {
  const int t = a * b + 128;
  return ((t >> 8) + t) >> 8;
}

// Pillow's RGB -> L (ITU-R 601-2 luma, fixed point). Gray in, the same gray
// out: the weights sum to 65536.
inline uint8_t pillow_luma(uint8_t r, uint8_t g, uint8_t b) {
  return static_cast<uint8_t>((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16);
}

// Pillow's F -> L: truncated toward zero, clipped to 0..255, NaN as 0.
inline uint8_t pillow_float_to_gray(float value) {
  if (!(value > 0.0f)) return 0;
  if (value >= 255.0f) return 255;
  return static_cast<uint8_t>(value);
}

struct Rgb {
  uint8_t r, g, b;
};

// Pillow's cmyk2rgb.
inline Rgb pillow_cmyk_to_rgb(int c, int m, int y, int k) {
  const int nk = 255 - k;
  return {clip8(nk - muldiv255(c, nk)), clip8(nk - muldiv255(m, nk)), clip8(nk - muldiv255(y, nk))};
}

// Pillow's YCbCr -> RGB (ConvertYCbCr.c: JPEG/JFIF coefficients in 6-bit
// fixed point, each table entry (int)((i - 128) * coefficient * 64 + 0.5),
// truncated toward zero as C's cast; equal to Pillow 13 on all 2^24 inputs).
namespace ycbcr {
inline constexpr int kScale = 6;
constexpr std::array<int16_t, 256> table(double coefficient) {
  std::array<int16_t, 256> out{};
  for (int i = 0; i < 256; ++i) {
    out[static_cast<size_t>(i)] =
        static_cast<int16_t>((i - 128) * coefficient * (1 << kScale) + 0.5);
  }
  return out;
}
inline constexpr std::array<int16_t, 256> kRFromCr = table(1.40200);
inline constexpr std::array<int16_t, 256> kGFromCb = table(-0.34414);
inline constexpr std::array<int16_t, 256> kGFromCr = table(-0.71414);
inline constexpr std::array<int16_t, 256> kBFromCb = table(1.77200);
}  // namespace ycbcr

inline Rgb pillow_ycbcr_to_rgb(uint8_t y, uint8_t cb, uint8_t cr) {
  using namespace ycbcr;
  return {clip8(y + (kRFromCr[cr] >> kScale)), clip8(y + ((kGFromCb[cb] + kGFromCr[cr]) >> kScale)),
          clip8(y + (kBFromCb[cb] >> kScale))};
}

// Writes one pixel, Pillow's RGBA value, in the requested channel count: 1
// (L: the luma; a gray pixel stays itself), 3 (RGB) or 4 (RGBA).
inline void put_pixel(uint8_t* pixel, int channels, uint8_t r, uint8_t g, uint8_t b,
                      uint8_t a = 255) {
  if (channels == 1) {
    pixel[0] = pillow_luma(r, g, b);
    return;
  }
  pixel[0] = r;
  pixel[1] = g;
  pixel[2] = b;
  if (channels == 4) pixel[3] = a;
}

}  // namespace leanloader::detail
