#include "io/read_around.h"

#include <gtest/gtest.h>
#include <sys/vfs.h>

#include <chrono>
#include <fstream>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "test_util.h"

namespace leanloader {
namespace {

using detail::File;
using detail::ReadAround;
using testing::kPage;
using testing::resident_pages;
using testing::TempDir;

using testing::kMiB;

std::string write_file(const TempDir& dir, size_t bytes) {
  return testing::write_filled_file(dir.file("rows.bin"), bytes);
}

// Waits (up to 20 s: the reads were started, a busy disk may take its time)
// until every page of [offset, offset + length) is resident.
bool becomes_resident(const std::string& path, size_t offset, size_t length) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (resident_pages(path, offset, length) < length / kPage) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

TEST(ReadAroundTest, ReadsTheAlignedWindowHoldingARowAndNotBeyondIt) {
  TempDir dir;
  const std::string path = write_file(dir, 8 * kMiB);
  if (testing::evict_from_page_cache(path) > 0) GTEST_SKIP() << "pages stay resident here (tmpfs)";
  const auto file = std::make_shared<const File>(path);
  const ReadAround around(file, 0, file->size(), kMiB);
  around.announce(3 * kMiB + 4096 * 3);  // a row in the fourth window
  ASSERT_TRUE(becomes_resident(path, 3 * kMiB, kMiB));
  EXPECT_EQ(resident_pages(path, 0, 2 * kMiB), 0u);
  EXPECT_EQ(resident_pages(path, 5 * kMiB, 3 * kMiB), 0u);
}

TEST(ReadAroundTest, AWindowIsReadOnceThenAgainWhenAnnouncedLater) {
  TempDir dir;
  const std::string path = write_file(dir, 4 * kMiB);
  if (testing::evict_from_page_cache(path) > 0) GTEST_SKIP() << "pages stay resident here (tmpfs)";
  const auto file = std::make_shared<const File>(path);
  const ReadAround around(file, 0, file->size(), kMiB, std::chrono::milliseconds(50));
  around.announce(kMiB);
  ASSERT_TRUE(becomes_resident(path, kMiB, kMiB));
  // Evicted since (a later pass over a file dropped from the page cache):
  // announced again after the interval, the window is read again.
  testing::evict_from_page_cache(path);
  std::this_thread::sleep_for(std::chrono::milliseconds(60));
  around.announce(kMiB + 200);
  EXPECT_TRUE(becomes_resident(path, kMiB, kMiB));
}

TEST(ReadAroundTest, AWindowAnnouncedRecentlyIsNotReadAgain) {
  TempDir dir;
  const std::string path = write_file(dir, 2 * kMiB);
  if (testing::evict_from_page_cache(path) > 0) GTEST_SKIP() << "pages stay resident here (tmpfs)";
  const auto file = std::make_shared<const File>(path);
  const ReadAround around(file, 0, file->size(), kMiB, std::chrono::hours(1));
  EXPECT_EQ(around.announce(0), kMiB);
  ASSERT_TRUE(becomes_resident(path, 0, kMiB));
  testing::evict_from_page_cache(path);
  EXPECT_EQ(around.announce(4096), 0u);  // the same window, within the hour: no read
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(resident_pages(path, 0, kMiB), 0u);
}

TEST(ReadAroundTest, WindowsStopAtTheRowsRange) {
  TempDir dir;
  const std::string path = write_file(dir, 4 * kMiB);
  if (testing::evict_from_page_cache(path) > 0) GTEST_SKIP() << "pages stay resident here (tmpfs)";
  const auto file = std::make_shared<const File>(path);
  // Rows from byte 128 (a header before them) to 3 MiB: the last window
  // ends where the rows do, the first starts at the rows.
  const ReadAround around(file, 128, 3 * kMiB, 2 * kMiB);
  EXPECT_EQ(around.announce(2 * kMiB + 5), kMiB);  // [2 MiB, 3 MiB): cut at the rows' end
  ASSERT_TRUE(becomes_resident(path, 2 * kMiB, kMiB));
  EXPECT_EQ(resident_pages(path, 3 * kMiB, kMiB), 0u);
  EXPECT_EQ(around.announce(3 * kMiB), 0u);  // past the rows: nothing
  EXPECT_EQ(around.announce(0), 0u);         // the header: nothing
  EXPECT_EQ(resident_pages(path, 0, 2 * kMiB), 0u);
}

TEST(ReadAroundTest, OnlyWhereTheDeviceReadsMoreThanARowAndTheRowsFitInMemory) {
  TempDir dir;
  const std::string path = write_file(dir, kMiB);
  const auto file = std::make_shared<const File>(path);
  const size_t read_ahead = detail::device_read_ahead_bytes(file->fd());
  constexpr uint64_t kPlenty = uint64_t{1} << 40;
  // A row as large as the device's read-ahead gains nothing from windows.
  EXPECT_EQ(ReadAround::for_rows(file, 0, kMiB, std::max(read_ahead, size_t{1}), kPlenty), nullptr);
  // Rows that would take more than half the available memory: none.
  EXPECT_EQ(ReadAround::for_rows(file, 0, kMiB, 1, kMiB), nullptr);
  const auto around = ReadAround::for_rows(file, 0, kMiB, 1, kPlenty);
  if (read_ahead <= 1) {
    EXPECT_EQ(around, nullptr) << "no read-ahead known for this file system";
  } else {
    ASSERT_NE(around, nullptr);
    EXPECT_GE(around->window_bytes(), read_ahead / 2);  // a power of two at most read_ahead
    EXPECT_LE(around->window_bytes(), read_ahead);
  }
  // tmpfs has no block device: no read-ahead to match.
  struct statfs fs {};
  if (::statfs("/dev/shm", &fs) == 0 && fs.f_type == 0x01021994 /* TMPFS_MAGIC */) {
    const std::string shm_path =
        "/dev/shm/leanloader-read-around-test-" + std::to_string(::getpid());
    { std::ofstream(shm_path) << "x"; }
    const File shm_file(shm_path);
    EXPECT_EQ(detail::device_read_ahead_bytes(shm_file.fd()), 0u);
    ::unlink(shm_path.c_str());
  }
}

}  // namespace
}  // namespace leanloader
