#include "io/storage_faults.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "test_util.h"

namespace leanloader {
namespace {

using detail::StorageFaultWatch;
using testing::TempDir;

// Sums one byte of every page of the file through a fresh mapping (each
// page a fault: minor when cached, major when it waits for storage).
long touch_every_page(const std::string& path, size_t bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  void* mapped = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (mapped == MAP_FAILED) return -1;
  ::madvise(mapped, bytes, MADV_RANDOM);  // a fault reads its own page only
  long sum = 0;
  for (size_t offset = 0; offset < bytes; offset += testing::kPage) {
    sum += static_cast<const volatile unsigned char*>(mapped)[offset];
  }
  ::munmap(mapped, bytes);
  return sum;
}

// Faults that wait for storage are seen; faults on cached pages are not.
// (Each case on its own thread: the count is the thread's.)
TEST(StorageFaultWatchTest, SeesFaultsThatWaitForStorageOnly) {
  TempDir dir;
  const size_t bytes = size_t{4} << 20;
  const std::string path = testing::write_filled_file(dir.file("data.bin"), bytes);
  if (testing::evict_from_page_cache(path) > 4) {
    GTEST_SKIP() << "the file system keeps the file in memory (tmpfs?)";
  }
  const StorageFaultWatch watch(/*eager_checks=*/100, /*check_every=*/16);
  bool cold_seen = false;
  std::thread([&] {
    EXPECT_FALSE(watch.faulted_since_last_check());  // a thread's first check learns its count
    EXPECT_GT(touch_every_page(path, bytes), 0);
    cold_seen = watch.faulted_since_last_check();
  }).join();
  EXPECT_TRUE(cold_seen);

  bool warm_seen = true;
  std::thread([&] {
    EXPECT_FALSE(watch.faulted_since_last_check());
    EXPECT_GT(touch_every_page(path, bytes), 0);  // cached now: minor faults
    warm_seen = watch.faulted_since_last_check();
  }).join();
  EXPECT_FALSE(warm_seen);
}

// After its eager checks, a watch checks every check_every-th call of a
// thread: the calls in between report nothing, even after faults.
TEST(StorageFaultWatchTest, ChecksEveryNthCallAfterTheEagerOnes) {
  TempDir dir;
  const size_t bytes = size_t{1} << 20;
  const std::string path = testing::write_filled_file(dir.file("data.bin"), bytes);
  const StorageFaultWatch watch(/*eager_checks=*/0, /*check_every=*/4);
  std::thread([&] {
    EXPECT_FALSE(watch.faulted_since_last_check());  // the first call checks
    if (testing::evict_from_page_cache(path) > 4) return;
    EXPECT_GT(touch_every_page(path, bytes), 0);
    EXPECT_FALSE(watch.faulted_since_last_check());  // calls 1-3 of 4 do not check
    EXPECT_FALSE(watch.faulted_since_last_check());
    EXPECT_FALSE(watch.faulted_since_last_check());
    EXPECT_TRUE(watch.faulted_since_last_check());  // the 4th does
  }).join();
}

}  // namespace
}  // namespace leanloader
