// resample_bilinear: properties Pillow's resampling has (its exact values
// are checked against Pillow itself in tests/python/test_image.py).
#include "image/resample.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace leanloader::detail {
namespace {

std::vector<uint8_t> resample(const std::vector<uint8_t>& pixels, int64_t width, int64_t height,
                              int channels, int64_t out_width, int64_t out_height) {
  std::vector<uint8_t> out(static_cast<size_t>(out_width * out_height * channels));
  std::vector<uint8_t> scratch;
  const PixelPlane plane{pixels.data(), width, height, channels,
                         static_cast<size_t>(width * channels)};
  resample_bilinear(plane, 0.0f, 0.0f, static_cast<float>(width), static_cast<float>(height),
                    out_width, out_height, out.data(), scratch);
  return out;
}

TEST(ResampleTest, AFlatImageStaysFlatForAnyPairOfFactors) {
  const std::vector<uint8_t> flat(64 * 48 * 3, 77);
  for (const auto& [w, h] : {std::pair{16, 12}, std::pair{100, 12}, std::pair{16, 90},
                             std::pair{128, 96}, std::pair{64, 48}}) {
    const auto out = resample(flat, 64, 48, 3, w, h);
    for (const uint8_t value : out) ASSERT_EQ(value, 77) << w << "x" << h;
  }
}

TEST(ResampleTest, HalvingAveragesUnderTheWidenedTriangle) {
  // 1-D, 4 -> 2: output 0 is centred at 1.0 under a triangle of half-width
  // 2 (the shrink factor); input pixel x sits at x + 0.5, so inputs 0, 1, 2
  // weigh 0.75, 0.75, 0.25 (normalised by their sum), and output 1 mirrors.
  const std::vector<uint8_t> row = {0, 100, 200, 40};
  const auto out = resample(row, 4, 1, 1, 2, 1);
  EXPECT_EQ(out[0], static_cast<uint8_t>((0 * 0.75 + 100 * 0.75 + 200 * 0.25) / 1.75 + 0.5));
  EXPECT_EQ(out[1], static_cast<uint8_t>((100 * 0.25 + 200 * 0.75 + 40 * 0.75) / 1.75 + 0.5));
}

TEST(ResampleTest, ShrinkingOneAxisWhileGrowingTheOtherAntialiasesTheShrink) {
  // Columns alternating 0/255 shrunk 4x across while rows grow 2x: an
  // unfiltered sampler would keep 0s or 255s; the widened triangle averages.
  const int64_t width = 64, height = 8;
  std::vector<uint8_t> stripes(static_cast<size_t>(width * height));
  for (int64_t y = 0; y < height; ++y) {
    for (int64_t x = 0; x < width; ++x) stripes[size_t(y * width + x)] = x % 2 ? 255 : 0;
  }
  const auto out = resample(stripes, width, height, 1, 16, 16);
  for (size_t i = 0; i < out.size(); ++i) {
    const int64_t x = static_cast<int64_t>(i) % 16;
    if (x == 0 || x == 15) continue;  // (edges see one side only)
    ASSERT_GE(out[i], 110) << i;
    ASSERT_LE(out[i], 145) << i;
  }
}

}  // namespace
}  // namespace leanloader::detail
