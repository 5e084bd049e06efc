// file_backing: real files, real mappings.
#include "leanloader/workers/file_backing.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "test_util.h"

namespace leanloader {
namespace {

using testing::kPage;

std::string write_file(const testing::TempDir& dir, const std::string& name, size_t bytes) {
  const std::string path = dir.path() + "/" + name;
  std::vector<char> data(bytes);
  for (size_t i = 0; i < bytes; ++i) data[i] = static_cast<char>(i * 7);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(::write(fd, data.data(), bytes), static_cast<ssize_t>(bytes));
  ::close(fd);
  return path;
}

std::byte* map(const std::string& path, size_t bytes, int protection, int flags, off_t offset) {
  const int fd =
      ::open(path.c_str(), (protection & PROT_WRITE) && (flags & MAP_SHARED) ? O_RDWR : O_RDONLY);
  EXPECT_GE(fd, 0);
  void* data = ::mmap(nullptr, bytes, protection, flags, fd, offset);
  ::close(fd);
  EXPECT_NE(data, MAP_FAILED);
  return static_cast<std::byte*>(data);
}

TEST(FileBackingTest, ARangeOfAMappedFileIsFoundWithItsOffset) {
  testing::TempDir dir;
  const std::string path = write_file(dir, "tokens.bin", 8 * kPage);
  std::byte* data = map(path, 6 * kPage, PROT_READ, MAP_SHARED, 2 * kPage);
  const auto backing = file_backing(data + 100, 3 * kPage);
  ASSERT_TRUE(backing.has_value());
  EXPECT_EQ(backing->path, path);
  EXPECT_EQ(backing->offset, 2 * kPage + 100);
  EXPECT_FALSE(backing->shared);  // read-only: nothing reaches the file
  EXPECT_FALSE(file_backing(data + 5 * kPage, 2 * kPage).has_value());  // past the mapping
  ::munmap(data, 6 * kPage);
}

TEST(FileBackingTest, AWritableSharedMappingIsShared) {
  testing::TempDir dir;
  const std::string path = write_file(dir, "rw.bin", 2 * kPage);
  std::byte* data = map(path, 2 * kPage, PROT_READ | PROT_WRITE, MAP_SHARED, 0);
  data[10] = std::byte{1};  // reaches the file: still its bytes
  const auto backing = file_backing(data, 2 * kPage);
  ASSERT_TRUE(backing.has_value());
  EXPECT_TRUE(backing->shared);
  ::munmap(data, 2 * kPage);
}

TEST(FileBackingTest, APrivatePageWrittenIsNoLongerTheFiles) {
  testing::TempDir dir;
  const std::string path = write_file(dir, "cow.bin", 4 * kPage);
  std::byte* data = map(path, 4 * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE, 0);
  volatile std::byte read = data[kPage];  // a read keeps the file's page
  (void)read;
  ASSERT_TRUE(file_backing(data, 4 * kPage).has_value());
  data[2 * kPage + 5] = std::byte{9};  // a private copy of that page
  EXPECT_FALSE(file_backing(data, 4 * kPage).has_value());
  EXPECT_TRUE(file_backing(data, 2 * kPage).has_value());  // the pages before it still are
  ::munmap(data, 4 * kPage);
}

TEST(FileBackingTest, AnonymousDeletedOrReplacedFilesAreNot) {
  std::vector<std::byte> heap(3 * kPage);
  EXPECT_FALSE(file_backing(heap.data(), heap.size()).has_value());
  testing::TempDir dir;
  const std::string path = write_file(dir, "gone.bin", 2 * kPage);
  std::byte* data = map(path, 2 * kPage, PROT_READ, MAP_SHARED, 0);
  ASSERT_TRUE(file_backing(data, kPage).has_value());
  // Replaced by a rename: the name is another file now.
  const std::string other = write_file(dir, "other.bin", 2 * kPage);
  ASSERT_EQ(::rename(other.c_str(), path.c_str()), 0);
  EXPECT_FALSE(file_backing(data, kPage).has_value());
  ::unlink(path.c_str());
  EXPECT_FALSE(file_backing(data, kPage).has_value());  // "(deleted)"
  ::munmap(data, 2 * kPage);
  EXPECT_FALSE(file_backing(nullptr, 0).has_value());
}

}  // namespace
}  // namespace leanloader
