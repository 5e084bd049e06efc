#include "leanloader/core/checked_size.h"

#include <gtest/gtest.h>

#include <limits>
#include <vector>

namespace leanloader {
namespace {

constexpr size_t kMax = std::numeric_limits<size_t>::max();

TEST(CheckedSize, MultiplyAndAddDetectOverflow) {
  EXPECT_EQ(checked_mul(1u << 20, 1u << 20), size_t{1} << 40);
  EXPECT_FALSE(checked_mul(size_t{1} << 62, 8).has_value());
  EXPECT_EQ(checked_mul(kMax, 0), 0u);
  EXPECT_EQ(checked_add(kMax - 1, 1), kMax);
  EXPECT_FALSE(checked_add(kMax, 1).has_value());
  EXPECT_EQ(checked_round_up(65, 64), 128u);
  EXPECT_FALSE(checked_round_up(kMax - 3, 64).has_value());
}

TEST(CheckedSize, NbytesOfShapes) {
  const std::vector<int64_t> image{224, 224, 3};
  EXPECT_EQ(checked_nbytes(image, DType::kF32), 224u * 224u * 3u * 4u);
  const std::vector<int64_t> empty{0, int64_t{1} << 62};
  EXPECT_EQ(checked_nbytes(empty, DType::kF64), 0u);
  // The crafted headers: 2^62 int32 and 1 x 2^61 float64 elements.
  const std::vector<int64_t> huge{int64_t{1} << 62};
  EXPECT_FALSE(checked_nbytes(huge, DType::kI32).has_value());
  const std::vector<int64_t> wide{1, int64_t{1} << 61};
  EXPECT_FALSE(checked_nbytes(wide, DType::kF64).has_value());
  const std::vector<int64_t> negative{4, -1};
  EXPECT_FALSE(checked_numel(negative).has_value());
}

TEST(CheckedSize, SubByteTensorsPackIntoWholeBytes) {
  // The reference's rule: numel x bits must be a multiple of 8 (checked on
  // the total, so F4 [2, 3] packs and F4 [3, 7] does not).
  using S = std::vector<int64_t>;
  EXPECT_EQ(checked_nbytes(S{3, 8}, DType::kF4), 12u);
  EXPECT_EQ(checked_nbytes(S{2, 3}, DType::kF4), 3u);
  EXPECT_EQ(checked_nbytes(S{2, 1}, DType::kF4), 1u);
  EXPECT_FALSE(checked_nbytes(S{3, 7}, DType::kF4).has_value());
  EXPECT_FALSE(checked_nbytes(S{1, 1}, DType::kF4).has_value());
  EXPECT_FALSE(checked_nbytes(S{}, DType::kF4).has_value());  // a scalar: 4 bits
  EXPECT_EQ(checked_nbytes(S{3, 0}, DType::kF4), 0u);
  EXPECT_EQ(checked_nbytes(S{2, 4}, DType::kF6E2M3), 6u);
  EXPECT_EQ(checked_nbytes(S{4}, DType::kF6E3M2), 3u);
  EXPECT_EQ(checked_nbytes(S{2, 4, 1}, DType::kF6E2M3), 6u);
  EXPECT_FALSE(checked_nbytes(S{3}, DType::kF6E2M3).has_value());
  EXPECT_FALSE(checked_nbytes(S{5, 2}, DType::kF6E3M2).has_value());
  EXPECT_EQ(checked_nbits(S{3, 7}, DType::kF4), 84u);
  EXPECT_EQ(checked_nbytes_for(6, DType::kF4), 3u);
  EXPECT_FALSE(checked_nbytes_for(5, DType::kF4).has_value());
  EXPECT_EQ(checked_nbytes_for(3, DType::kC64), 24u);
  // Bits overflow before bytes would (the reference counts in bits too).
  EXPECT_FALSE(checked_nbits(S{int64_t{1} << 61, 2}, DType::kF4).has_value());
  EXPECT_FALSE(checked_nbytes(S{int64_t{1} << 61, 2}, DType::kF4).has_value());
  EXPECT_EQ(checked_nbits(S{int64_t{1} << 60}, DType::kF4), size_t{1} << 62);
  EXPECT_EQ(checked_nbytes(S{int64_t{1} << 60}, DType::kF4), size_t{1} << 59);
  EXPECT_FALSE(checked_nbits(S{int64_t{1} << 58}, DType::kC64).has_value());
}

TEST(CheckedSize, RangeFits) {
  EXPECT_TRUE(range_fits(0, 4096, 4096));
  EXPECT_FALSE(range_fits(1, 4096, 4096));
  EXPECT_FALSE(range_fits(kMax, 2, kMax));
}

}  // namespace
}  // namespace leanloader
