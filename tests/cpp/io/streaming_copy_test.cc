#include "io/streaming_copy.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

namespace leanloader::detail {
namespace {

std::vector<std::byte> pattern(size_t bytes) {
  std::vector<std::byte> values(bytes);
  for (size_t i = 0; i < bytes; ++i) values[i] = static_cast<std::byte>((i * 131 + 7) % 251);
  return values;
}

// Every length and alignment of source and destination around a cache line,
// and a large copy: the bytes are memcpy's, nothing outside the range is
// written.
TEST(StreamingCopyTest, CopiesExactlyTheRangeAtAnyAlignmentAndLength) {
  const std::vector<std::byte> source = pattern(4096);
  for (const Stores stores : {Stores::kCached, Stores::kStreaming}) {
    for (size_t dst_offset = 0; dst_offset < 70; dst_offset += 3) {
      for (size_t src_offset = 0; src_offset < 70; src_offset += 5) {
        for (size_t bytes = 0; bytes < 300; bytes += 7) {
          std::vector<std::byte> destination(512, std::byte{0xee});
          copy_with(stores, destination.data() + dst_offset, source.data() + src_offset, bytes);
          ASSERT_EQ(std::memcmp(destination.data() + dst_offset, source.data() + src_offset, bytes),
                    0)
              << dst_offset << " " << src_offset << " " << bytes;
          for (size_t i = 0; i < destination.size(); ++i) {
            if (i < dst_offset || i >= dst_offset + bytes) {
              ASSERT_EQ(destination[i], std::byte{0xee}) << "wrote outside the range at " << i;
            }
          }
        }
      }
    }
  }
  const std::vector<std::byte> large = pattern(size_t{8} << 20);
  std::vector<std::byte> copy(large.size() + 1);
  copy_with_streaming_stores(copy.data() + 1, large.data(), large.size());
  EXPECT_EQ(std::memcmp(copy.data() + 1, large.data(), large.size()), 0);
}

// The cache a core uses, not the package's sum: where sysfs describes cpu0's
// L3, that is the size batches are weighed against (glibc's sysconf gave 8
// times it on an EPYC VM, and 16 MiB batches were filled with cached stores).
TEST(StreamingCopyTest, TheLastLevelCacheIsTheOneThisCpuShares) {
  for (int index = 0; index < 8; ++index) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index);
    std::ifstream level(dir + "/level");
    std::ifstream size(dir + "/size");
    int number = 0;
    std::string text;
    if (!(level >> number) || number != 3 || !(size >> text)) continue;
    ASSERT_FALSE(text.empty());
    const size_t unit = text.back() == 'K' ? 1024 : text.back() == 'M' ? size_t{1} << 20 : 1;
    const size_t bytes = std::stoull(text) * unit;
    EXPECT_EQ(last_level_cache_bytes(), bytes) << text;
    EXPECT_EQ(streaming_batch_bytes(), std::max(kStreamingBatchBytes, bytes / 8));
    return;
  }
  GTEST_SKIP() << "sysfs does not describe an L3 cache here";
}

}  // namespace
}  // namespace leanloader::detail
