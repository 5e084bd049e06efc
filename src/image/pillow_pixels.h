// Pillow's per-pixel conversions (libImaging/Convert.c), shared by the codecs
// that decode samples themselves and then convert them as Pillow's
// Image.convert() would. Internal.
#pragma once

#include <algorithm>
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
