#include "leanloader/memory/bandwidth.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "leanloader/core/error.h"

namespace leanloader {
namespace {

TEST(BandwidthTest, OneThreadIsPositiveAndFinite) {
  const double bytes_per_second = measure_memcpy_bandwidth(1, size_t{4} << 20, 3);
  EXPECT_TRUE(std::isfinite(bytes_per_second));
  EXPECT_GT(bytes_per_second, 0.0);
}

TEST(BandwidthTest, SeveralThreadsArePositiveAndFinite) {
  const double bytes_per_second = measure_memcpy_bandwidth(2, size_t{4} << 20, 3);
  EXPECT_TRUE(std::isfinite(bytes_per_second));
  EXPECT_GT(bytes_per_second, 0.0);
}

TEST(BandwidthTest, TinyBufferStillFinite) {
  const double bytes_per_second = measure_memcpy_bandwidth(1, 1, 1);
  EXPECT_TRUE(std::isfinite(bytes_per_second));
  EXPECT_GT(bytes_per_second, 0.0);
}

TEST(BandwidthTest, RejectsInvalidArguments) {
  EXPECT_THROW(measure_memcpy_bandwidth(0, 1024, 1), InvalidArgument);
  EXPECT_THROW(measure_memcpy_bandwidth(1, 0, 1), InvalidArgument);
  EXPECT_THROW(measure_memcpy_bandwidth(1, 1024, 0), InvalidArgument);
}

// Small batches and batches past the streaming size: the same bytes.
TEST(BandwidthTest, CopyAsBatchSlotCopiesEveryByte) {
  for (const size_t bytes : {size_t{1}, size_t{4097}, size_t{33} << 20}) {
    std::vector<unsigned char> source(bytes);
    for (size_t i = 0; i < bytes; ++i) source[i] = static_cast<unsigned char>(i * 7 + 3);
    std::vector<unsigned char> destination(bytes + 2, 0xee);
    copy_as_batch_slot(destination.data() + 1, source.data(), bytes);
    EXPECT_EQ(std::memcmp(destination.data() + 1, source.data(), bytes), 0) << bytes;
    EXPECT_EQ(destination.front(), 0xee);
    EXPECT_EQ(destination.back(), 0xee);
  }
}

}  // namespace
}  // namespace leanloader
