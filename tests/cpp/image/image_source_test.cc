#include "leanloader/image/image_source.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "image/image_test_util.h"
#include "leanloader/core/error.h"
#include "test_util.h"

namespace leanloader {
namespace {

using testing::TempDir;

class ContextWriter final : public SampleWriter {
 public:
  ContextWriter(const Source& source, SampleContext context) : source_(source), context_(context) {}
  SampleContext context() const override { return context_; }
  std::span<std::byte> field_buffer(size_t field, const Shape& shape) override {
    if (buffers.size() <= field) buffers.resize(field + 1), shapes.resize(field + 1);
    shapes[field] = shape;
    buffers[field].resize(shape_numel(shape) * dtype_size(source_.fields()[field].dtype));
    return {buffers[field].data(), buffers[field].size()};
  }
  const Source& source_;
  SampleContext context_;
  std::vector<std::vector<std::byte>> buffers;
  std::vector<Shape> shapes;
};

void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}

TEST(ImageSourceTest, ReadsTransformedImagesAndLabels) {
  TempDir dir;
  const auto rgb = testing::pattern(80, 60);
  write_file(dir.file("a.jpg"), testing::encode_jpeg(rgb, 80, 60, 3));
  write_file(dir.file("b.png"),
             testing::encode_png(rgb.data(), rgb.size(), 80, 60, SPNG_COLOR_TYPE_TRUECOLOR, 8));
  ImageSourceOptions options;
  options.transforms = {TransformStep::random_resized_crop(16, 16),
                        TransformStep::horizontal_flip()};
  options.output.dtype = DType::kF32;
  const ImageSource source({dir.file("a.jpg"), dir.file("b.png")}, {3, 4}, options);
  ASSERT_EQ(source.fields().size(), 2u);
  EXPECT_EQ(source.fields()[0].shape, (Shape{3, 16, 16}));
  for (int64_t i = 0; i < 2; ++i) {
    ContextWriter writer(source, {5, 1});
    source.read_sample(i, writer);
    EXPECT_EQ(writer.shapes[0], (Shape{3, 16, 16}));
    int64_t label = 0;
    std::memcpy(&label, writer.buffers[1].data(), 8);
    EXPECT_EQ(label, 3 + i);
    // Same (seed, epoch, index): same pixels; the reported parameters agree.
    ContextWriter again(source, {5, 1});
    source.read_sample(i, again);
    EXPECT_EQ(writer.buffers[0], again.buffers[0]);
  }
  bool differs = false;
  for (uint64_t epoch = 0; epoch < 8; ++epoch) {
    differs |= !(source.sample_params(0, 5, epoch).crops == source.sample_params(0, 5, 1).crops);
  }
  EXPECT_TRUE(differs);
}

// What the front end needs to pick the warning's class: an image above
// max_pixels warns as a pixel-limit warning (Python: DecompressionBombWarning).
TEST(ImageSourceTest, AnImageAboveThePixelLimitWarnsOfThatKind) {
  TempDir dir;
  const auto rgb = testing::pattern(80, 60);
  write_file(dir.file("big.png"),
             testing::encode_png(rgb.data(), rgb.size(), 80, 60, SPNG_COLOR_TYPE_TRUECOLOR, 8));
  class WarnedWriter final : public SampleWriter {
   public:
    std::span<std::byte> field_buffer(size_t /*field*/, const Shape& shape) override {
      buffer.resize(shape_numel(shape));  // uint8 pixels
      return buffer;
    }
    void warn(Warning warning) override { warnings.push_back(std::move(warning)); }
    std::vector<std::byte> buffer;
    std::vector<Warning> warnings;
  };
  for (const uint64_t max_pixels : {uint64_t{4000}, uint64_t{4800}}) {
    ImageSourceOptions options;
    options.decode.max_pixels = max_pixels;
    const ImageSource source({dir.file("big.png")}, {}, options);
    WarnedWriter writer;
    source.read_sample(0, writer);
    if (max_pixels == 4800) {  // 80 x 60 pixels are not above it
      EXPECT_TRUE(writer.warnings.empty());
      continue;
    }
    ASSERT_EQ(writer.warnings.size(), 1u);
    EXPECT_EQ(writer.warnings[0].kind, WarningKind::kPixelLimit);
    EXPECT_NE(writer.warnings[0].message.find("80x60 pixels exceed max_pixels (4000)"),
              std::string::npos)
        << writer.warnings[0].message;
  }
}

TEST(ImageSourceTest, VariableShapesWithoutAFixedSizeTransform) {
  TempDir dir;
  const auto rgb = testing::pattern(40, 30);
  write_file(dir.file("a.png"),
             testing::encode_png(rgb.data(), rgb.size(), 40, 30, SPNG_COLOR_TYPE_TRUECOLOR, 8));
  ImageSourceOptions options;
  options.output.layout = ImageLayout::kHWC;
  const ImageSource source({dir.file("a.png")}, {}, options);
  EXPECT_FALSE(source.fields()[0].shape.has_value());
  ContextWriter writer(source, {});
  source.read_sample(0, writer);
  EXPECT_EQ(writer.shapes[0], (Shape{30, 40, 3}));
  EXPECT_EQ(0, std::memcmp(writer.buffers[0].data(), rgb.data(), rgb.size()));
}

TEST(ImageSourceTest, ErrorsNameTheFileTheSampleAndTheStage) {
  TempDir dir;
  write_file(dir.file("bad.jpg"), {0xFF, 0xD8, 0xFF, 0xE0, 0x00});
  const ImageSource source({dir.file("bad.jpg"), dir.file("missing.png")}, {}, {});
  ContextWriter writer(source, {});
  try {
    source.read_sample(0, writer);
    FAIL() << "no error";
  } catch (const SampleError& e) {
    EXPECT_EQ(e.stage(), "decode");
    EXPECT_EQ(e.sample_index(), 0);
    EXPECT_EQ(e.kind(), ErrorKind::kFormat);
    EXPECT_NE(std::string(e.what()).find("bad.jpg"), std::string::npos);
  }
  try {
    source.read_sample(1, writer);
    FAIL() << "no error";
  } catch (const SampleError& e) {
    EXPECT_EQ(e.stage(), "read");
    EXPECT_EQ(e.kind(), ErrorKind::kNotFound);
  }
}

}  // namespace
}  // namespace leanloader
