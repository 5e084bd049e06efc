#include "leanloader/memory/bandwidth.h"

#include <gtest/gtest.h>

#include <cmath>

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

}  // namespace
}  // namespace leanloader
