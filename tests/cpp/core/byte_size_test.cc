#include "leanloader/core/byte_size.h"

#include <gtest/gtest.h>

#include "leanloader/core/error.h"

namespace leanloader {
namespace {

TEST(ByteSize, ParsesUnits) {
  EXPECT_EQ(parse_byte_size("4GiB"), 4ULL << 30);
  EXPECT_EQ(parse_byte_size("512MB"), 512'000'000ULL);
  EXPECT_EQ(parse_byte_size("1.5 GB"), 1'500'000'000ULL);
  EXPECT_EQ(parse_byte_size("1024"), 1024ULL);
  EXPECT_THROW(parse_byte_size("lots"), InvalidArgument);
  EXPECT_THROW(parse_byte_size("3 parsecs"), InvalidArgument);
}

TEST(ByteSize, RejectsANumberThatIsNotConsumedWhole) {
  EXPECT_THROW(parse_byte_size("1.2.3"), InvalidArgument);
  EXPECT_THROW(parse_byte_size("1..5GB"), InvalidArgument);
  EXPECT_THROW(parse_byte_size("."), InvalidArgument);
  EXPECT_EQ(parse_byte_size(".5KB"), 500ULL);
}

}  // namespace
}  // namespace leanloader
