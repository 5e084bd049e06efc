// Pillow's Image.resize(size, Image.BILINEAR, box) for 8-bit interleaved
// pixels, bit for bit: libImaging/Resample.c's separable resampling with the
// triangle filter widened by the shrink factor on each axis (antialiasing
// whenever an axis shrinks, whatever the other does), coefficients
// normalised per output pixel and rounded to 22-bit fixed point, the
// horizontal pass first over the rows the vertical pass needs, results
// clipped to 0..255. torchvision's Resize and RandomResizedCrop on PIL
// images call exactly this. Internal.
//
// Why our own: OpenCV's INTER_AREA and INTER_LINEAR approximate it (a
// Gaussian makes up the filter's width: 37-44 dB, below 40 on fine detail),
// and Pillow's C code is not a library we can link. The arithmetic is short
// and its result is checked against Pillow itself in
// tests/python/test_image.py.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace leanloader::detail {

struct PixelPlane {
  const uint8_t* data = nullptr;
  int64_t width = 0;
  int64_t height = 0;
  int channels = 0;   // interleaved, 1..4
  size_t stride = 0;  // bytes per row
};

// Resamples the box [x0, x1) x [y0, y1) of `from` (Pillow's `box`, in
// pixels, may be fractional; the whole image when it is 0, 0, width,
// height) to width x height pixels at `to` (rows of width x channels bytes,
// no padding). `scratch` holds the intermediate rows between calls.
void resample_bilinear(const PixelPlane& from, float x0, float y0, float x1, float y1,
                       int64_t width, int64_t height, uint8_t* to, std::vector<uint8_t>& scratch);

}  // namespace leanloader::detail
