#include "leanloader/image/image_transform.h"

#include <gtest/gtest.h>

#include <cmath>

#include "image/image_test_util.h"
#include "leanloader/core/error.h"

namespace leanloader {
namespace {

using testing::as_bytes;
using Step = TransformStep;

TransformParams plan(const std::vector<Step>& steps, int64_t w, int64_t h, uint64_t index = 0) {
  SampleRandom random(0, 0, index);
  return ImageTransform(steps, {}, 3).plan(w, h, random);
}

TEST(ImageTransformTest, ResizeShorterSideTruncatesTheLongerAsTorchvision) {
  auto params = plan({Step::resize(256, 0)}, 500, 375);
  EXPECT_EQ(params.output_height, 256);
  EXPECT_EQ(params.output_width, 341);  // int(256 * 500 / 375)
  params = plan({Step::resize(100, 0, 150)}, 1000, 300);
  EXPECT_EQ(params.output_width, 150);
  EXPECT_EQ(params.output_height, 45);
  params = plan({Step::resize(30, 40)}, 7, 9);
  EXPECT_EQ(params.output_height, 30);
  EXPECT_EQ(params.output_width, 40);
}

TEST(ImageTransformTest, CenterCropRoundsHalvesToEvenAsPython) {
  const auto params = plan({Step::center_crop(4, 5)}, 10, 9);
  ASSERT_EQ(params.crops.size(), 1u);
  EXPECT_EQ(params.crops[0], (PixelBox{2, 2, 5, 4}));  // round(2.5) = 2, round(2.5) = 2
  // Larger than the image: torchvision pads (top gets (20 - 9) // 2 = 5 rows),
  // so the box reaches outside the image.
  EXPECT_EQ(plan({Step::center_crop(20, 5)}, 10, 9).crops.at(0), (PixelBox{2, -5, 5, 20}));
}

TEST(ImageTransformTest, RandomResizedCropBoxesFollowTheScaleAndRatioRanges) {
  const Step step = Step::random_resized_crop(224, 224);
  double log_ratio_sum = 0;
  for (uint64_t i = 0; i < 2000; ++i) {
    const auto params = plan({step}, 500, 375, i);
    log_ratio_sum += std::log(double(plan({step}, 400, 400, i).crops.at(0).width) /
                              double(plan({step}, 400, 400, i).crops.at(0).height));
    const PixelBox box = params.crops.at(0);
    ASSERT_GE(box.x, 0);
    ASSERT_GE(box.y, 0);
    ASSERT_LE(box.x + box.width, 500);
    ASSERT_LE(box.y + box.height, 375);
    const double area = double(box.width * box.height) / (500.0 * 375.0);
    ASSERT_GE(area, 0.07);
    const double ratio = double(box.width) / double(box.height);
    ASSERT_GE(ratio, 0.74);
    ASSERT_LE(ratio, 1.34);
    EXPECT_EQ(params.output_width, 224);
  }
  EXPECT_NEAR(log_ratio_sum / 2000, 0.0, 0.02);  // symmetric on a square image
  // No attempt fits a 1000x10 strip: the central fallback, clamped to 4/3.
  const auto strip = plan({Step::random_resized_crop(8, 8, 0.9, 1.0)}, 1000, 10);
  EXPECT_EQ(strip.crops.at(0), (PixelBox{493, 0, 13, 10}));
}

TEST(ImageTransformTest, FlipDrawsWithItsProbability) {
  int flipped = 0;
  for (uint64_t i = 0; i < 1000; ++i)
    flipped += plan({Step::horizontal_flip(0.3)}, 9, 9, i).flipped;
  EXPECT_NEAR(flipped, 300, 60);
  EXPECT_FALSE(plan({Step::horizontal_flip(0.0)}, 9, 9).flipped);
  EXPECT_TRUE(plan({Step::horizontal_flip(1.0)}, 9, 9).flipped);
}

TEST(ImageTransformTest, WritesNormalizedFlippedChwFloats) {
  const int w = 6, h = 4;
  const auto rgb = testing::pattern(w, h);
  const auto png = testing::encode_png(rgb.data(), rgb.size(), w, h, SPNG_COLOR_TYPE_TRUECOLOR, 8);
  ImageOutput output;
  output.dtype = DType::kF32;
  output.mean = {0.5f, 0.4f, 0.3f};
  output.std = {0.2f, 0.25f, 0.5f};
  const ImageTransform transform({Step::horizontal_flip(1.0)}, output, 3);
  const DecodeOptions options;
  const ImageInfo info = read_image_info(as_bytes(png), options);
  SampleRandom random(0, 0, 0);
  TransformParams params = transform.plan(info.width, info.height, random);
  std::vector<float> out(size_t(3 * h * w));
  transform.run(as_bytes(png), info, options, params, true,
                {reinterpret_cast<std::byte*>(out.data()), out.size() * 4});
  for (int c = 0; c < 3; ++c) {
    for (int y = 0; y < h; ++y) {
      for (int x = 0; x < w; ++x) {
        const float v = rgb[size_t((y * w + (w - 1 - x)) * 3 + c)] / 255.0f;
        ASSERT_FLOAT_EQ(out[size_t((c * h + y) * w + x)], (v - output.mean[c]) / output.std[c]);
      }
    }
  }
}

TEST(ImageTransformTest, CropThenResizeMatchesAResizeOfTheCrop) {
  const int w = 120, h = 90;
  const auto rgb = testing::pattern(w, h);
  const auto png = testing::encode_png(rgb.data(), rgb.size(), w, h, SPNG_COLOR_TYPE_TRUECOLOR, 8);
  ImageOutput hwc;
  hwc.layout = ImageLayout::kHWC;
  const ImageTransform transform({Step::center_crop(60, 80), Step::resize(30, 40)}, hwc, 3);
  EXPECT_EQ(transform.fixed_shape(), (Shape{30, 40, 3}));
  const DecodeOptions options;
  const ImageInfo info = read_image_info(as_bytes(png), options);
  SampleRandom random(0, 0, 0);
  TransformParams params = transform.plan(info.width, info.height, random);
  std::vector<uint8_t> out(30 * 40 * 3);
  transform.run(as_bytes(png), info, options, params, true,
                {reinterpret_cast<std::byte*>(out.data()), out.size()});
  // Close to a 2x2 average of the crop at (20, 15), far from one elsewhere
  // (antialiasing blurs slightly more than the 2x2 box).
  auto mean_error = [&](int left, int top) {
    double error = 0;
    for (int y = 0; y < 30; ++y) {
      for (int x = 0; x < 40; ++x) {
        int sum = 0;
        for (int dy = 0; dy < 2; ++dy) {
          for (int dx = 0; dx < 2; ++dx) {
            sum += rgb[size_t(((top + 2 * y + dy) * w + left + 2 * x + dx) * 3 + 1)];
          }
        }
        error += std::abs(out[size_t((y * 40 + x) * 3 + 1)] - sum / 4.0);
      }
    }
    return error / (30 * 40);
  };
  EXPECT_LT(mean_error(20, 15), 3.0);
  EXPECT_GT(mean_error(22, 15), 3 * mean_error(20, 15));
}

TEST(ImageTransformTest, CropsAfterAFlipAreMirrored) {
  const int w = 30, h = 20;
  const auto rgb = testing::pattern(w, h);
  const auto png = testing::encode_png(rgb.data(), rgb.size(), w, h, SPNG_COLOR_TYPE_TRUECOLOR, 8);
  ImageOutput hwc;
  hwc.layout = ImageLayout::kHWC;
  const ImageTransform transform({Step::horizontal_flip(1.0), Step::center_crop(12, 13)}, hwc, 3);
  const DecodeOptions options;
  const ImageInfo info = read_image_info(as_bytes(png), options);
  SampleRandom random(0, 0, 0);
  TransformParams params = transform.plan(info.width, info.height, random);
  EXPECT_EQ(params.flips, std::vector<bool>{true});
  EXPECT_EQ(params.crops.at(0), (PixelBox{8, 4, 13, 12}));  // in the flipped image
  std::vector<uint8_t> out(12 * 13 * 3);
  transform.run(as_bytes(png), info, options, params, true,
                {reinterpret_cast<std::byte*>(out.data()), out.size()});
  // Output column x is flipped column 8 + x = original column w - 1 - 8 - x.
  for (int y = 0; y < 12; ++y) {
    for (int x = 0; x < 13; ++x) {
      for (int c = 0; c < 3; ++c) {
        ASSERT_EQ(out[size_t((y * 13 + x) * 3 + c)],
                  rgb[size_t(((4 + y) * w + w - 9 - x) * 3 + c)]);
      }
    }
  }
}

TEST(ImageTransformTest, RejectsBadSteps) {
  EXPECT_THROW(ImageTransform({Step::resize(0, 0)}, {}, 3), InvalidArgument);
  EXPECT_THROW(ImageTransform({Step::horizontal_flip(1.5)}, {}, 3), InvalidArgument);
  EXPECT_THROW(ImageTransform({Step::random_resized_crop(8, 8, 0.5, 0.1)}, {}, 3), InvalidArgument);
  ImageOutput bad;
  bad.mean = {0.5f};
  bad.std = {0.5f};
  EXPECT_THROW(ImageTransform({}, bad, 3), InvalidArgument);  // uint8 cannot be normalized
}

}  // namespace
}  // namespace leanloader
