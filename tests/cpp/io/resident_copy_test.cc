#include "io/resident_copy.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <vector>

#include "leanloader/core/storage.h"
#include "test_util.h"

namespace leanloader::detail {
namespace {

using testing::TempDir;

constexpr size_t kFileBytes = size_t{3} << 20;  // more than one mincore query (1 MiB)

std::vector<std::byte> write_file(const std::string& path) {
  std::vector<std::byte> bytes(kFileBytes);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::byte>(i * 17 % 253);
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
  return bytes;
}

TEST(ResidentCopyTest, CopiesARangeInMemoryAtAnyOffset) {
  TempDir dir;
  const std::vector<std::byte> bytes = write_file(dir.file("data"));
  const auto mapping = MappedFile::open(dir.file("data"));
  for (const Stores stores : {Stores::kCached, Stores::kStreaming}) {
    for (const size_t offset : {size_t{0}, size_t{1}, size_t{4095}, size_t{(1 << 20) - 3}}) {
      const size_t length = kFileBytes - offset - 5;
      std::vector<std::byte> out(length);
      ASSERT_EQ(copy_if_resident(out.data(), mapping->data() + offset, length, stores),
                ResidentCopy::kCopied);
      EXPECT_EQ(std::memcmp(out.data(), bytes.data() + offset, length), 0) << offset;
    }
  }
}

// A range not in memory is left to the caller (who preads it and so notices
// the read from storage): nothing is copied, and asking reads nothing in.
TEST(ResidentCopyTest, ARangeNotInMemoryIsNotCopied) {
  TempDir dir;
  write_file(dir.file("data"));
  if (testing::evict_from_page_cache(dir.file("data")) > 0)
    GTEST_SKIP() << "the file system keeps the file in memory";
  const auto mapping = MappedFile::open(dir.file("data"));
  std::vector<std::byte> out(kFileBytes, std::byte{0xee});
  EXPECT_EQ(copy_if_resident(out.data(), mapping->data(), kFileBytes, Stores::kStreaming),
            ResidentCopy::kNotResident);
  EXPECT_EQ(out.front(), std::byte{0xee});
  EXPECT_EQ(testing::evict_from_page_cache(dir.file("data")), 0u);  // nothing read in
}

// A file truncated after it was mapped: its lost pages are never copied, and
// the process survives (SIGBUS would end it).
TEST(ResidentCopyTest, PagesTheFileLostAreNotCopied) {
  TempDir dir;
  write_file(dir.file("data"));
  const auto mapping = MappedFile::open(dir.file("data"));
  ASSERT_EQ(::truncate(dir.file("data").c_str(), 4096), 0);
  std::vector<std::byte> out(kFileBytes);
  EXPECT_NE(copy_if_resident(out.data(), mapping->data(), kFileBytes, Stores::kStreaming),
            ResidentCopy::kCopied);
}

}  // namespace
}  // namespace leanloader::detail
