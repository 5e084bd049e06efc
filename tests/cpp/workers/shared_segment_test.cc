// SharedSegment and SlotPool: real tmpfs files, real mappings, real forks.
#include "leanloader/workers/shared_segment.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "leanloader/core/error.h"
#include "leanloader/workers/shared_arena.h"
#include "leanloader/workers/slot_pool.h"
#include "test_util.h"

namespace leanloader {
namespace {

size_t entries_in(const std::string& dir) {
  size_t n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    (void)entry;
    ++n;
  }
  return n;
}

TEST(SharedSegmentTest, CreateLeavesNoNameBehind) {
  testing::TempDir dir;
  auto segment = SharedSegment::create(1 << 20, dir.path());
  EXPECT_EQ(segment->size(), size_t{1} << 20);
  EXPECT_EQ(entries_in(dir.path()), 0u);
  std::memset(segment->data(), 7, segment->size());  // every page is reserved: no SIGBUS
  EXPECT_EQ(static_cast<int>(segment->data()[12345]), 7);
}

TEST(SharedSegmentTest, DefaultDirectoryFollowsEnvironment) {
  testing::TempDir dir;
  ::setenv("LEANLOADER_SHM_DIR", dir.path().c_str(), 1);
  EXPECT_EQ(default_shm_dir(), dir.path());
  auto segment = SharedSegment::create(4096);
  EXPECT_EQ(segment->path().rfind(dir.path(), 0), 0u);
  ::unsetenv("LEANLOADER_SHM_DIR");
  EXPECT_EQ(default_shm_dir(), "");
}

std::string link_target(const std::string& path) {
  char target[4096];
  const ssize_t n = ::readlink(path.c_str(), target, sizeof(target) - 1);
  return n < 0 ? std::string() : std::string(target, static_cast<size_t>(n));
}

TEST(SharedSegmentTest, WithoutADirectoryASegmentIsAMemfd) {
  // No tmpfs size applies (Docker's 64 MiB /dev/shm), and no name exists
  // that a SIGKILL could leave behind.
  auto segment = SharedSegment::create(1 << 20);
  EXPECT_EQ(segment->path().rfind("memfd:leanloader-", 0), 0u) << segment->path();
  EXPECT_EQ(link_target(segment->attach_path()).rfind("/memfd:leanloader-", 0), 0u);
  std::memset(segment->data(), 3, segment->size());
  auto attached = SharedSegment::attach(segment->attach_path());
  EXPECT_EQ(static_cast<int>(attached->data()[4097]), 3);
  // Only a segment whose pages are mapped privately over this process's
  // own memory is remembered (batch segments are made by the thousand).
  struct stat st {};
  ASSERT_EQ(::fstat(segment->fd(), &st), 0);
  EXPECT_FALSE(SharedSegment::mapped_privately_here(st.st_dev, st.st_ino));
  SharedSegment::remember_mapped_privately(*segment);
  EXPECT_TRUE(SharedSegment::mapped_privately_here(st.st_dev, st.st_ino));
  ASSERT_EQ(::fstat(attached->fd(), &st), 0);
  EXPECT_TRUE(SharedSegment::mapped_privately_here(st.st_dev, st.st_ino));  // the same file
}

TEST(SharedSegmentTest, InADirectoryTheFileNeverHasAName) {
  // O_TMPFILE: the inode is on the directory's file system (its size limit
  // applies) but no name is ever linked, not even for an instant.
  testing::TempDir dir;
  auto segment = SharedSegment::create(8192, dir.path());
  EXPECT_EQ(entries_in(dir.path()), 0u);
  EXPECT_NE(link_target(segment->attach_path()).find(" (deleted)"), std::string::npos);
  struct stat st {};
  ASSERT_EQ(::stat(dir.path().c_str(), &st), 0);
  struct stat own {};
  ASSERT_EQ(::fstat(segment->fd(), &own), 0);
  EXPECT_EQ(own.st_dev, st.st_dev);
  EXPECT_FALSE(
      SharedSegment::mapped_privately_here(st.st_dev, st.st_ino));  // the directory is not ours
}

TEST(SharedSegmentTest, AttachSeesWritesOfAnotherProcess) {
  auto segment = SharedSegment::create(8192);
  const std::string path = segment->attach_path();
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    try {
      auto attached = SharedSegment::attach(path);
      const char message[] = "written by the child";
      attached->write(100, message, sizeof(message));
      ::_exit(attached->size() == 8192 ? 0 : 2);
    } catch (...) {
      ::_exit(3);
    }
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0);
  EXPECT_STREQ(reinterpret_cast<const char*>(segment->data() + 100), "written by the child");
}

TEST(SharedSegmentTest, WriteOutOfRangeAndReadOnlyAreRejected) {
  auto segment = SharedSegment::create(4096);
  const char byte = 1;
  EXPECT_THROW(segment->write(4096, &byte, 1), InvalidArgument);
  EXPECT_THROW(segment->write(4000, &byte, 200), InvalidArgument);
  auto read_only = SharedSegment::attach(segment->attach_path(), false);
  EXPECT_FALSE(read_only->writable());
  EXPECT_THROW(read_only->write(0, &byte, 1), InvalidArgument);
}

TEST(SharedSegmentTest, CopyOnWriteAttachKeepsWritesPrivate) {
  auto segment = SharedSegment::create(8192);
  std::memset(segment->data(), 1, segment->size());
  auto private_view = SharedSegment::attach(segment->attach_path(), true, true);
  EXPECT_TRUE(private_view->copy_on_write());
  EXPECT_EQ(static_cast<int>(private_view->data()[5000]), 1);  // reads the shared pages
  const char two = 2;
  private_view->write(5000, &two, 1);
  EXPECT_EQ(static_cast<int>(private_view->data()[5000]), 2);
  EXPECT_EQ(static_cast<int>(segment->data()[5000]), 1);  // the owner never sees it
}

TEST(SharedSegmentTest, AttachMissingPathIsNotFound) {
  try {
    SharedSegment::attach("/proc/self/fd/987654");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kNotFound);
  }
}

TEST(SharedSegmentTest, FindLocatesLiveSegmentsOnly) {
  auto segment = SharedSegment::create(4096);
  EXPECT_EQ(SharedSegment::find(segment->data() + 10), segment);
  EXPECT_EQ(SharedSegment::find(segment->data() + 4096), nullptr);
  const std::byte* address = segment->data();
  segment.reset();
  EXPECT_EQ(SharedSegment::find(address), nullptr);
  int local = 0;
  EXPECT_EQ(SharedSegment::find(&local), nullptr);
}

TEST(SharedSegmentTest, TheDescriptorOfASharedMappingIsFoundFromItsAddress) {
  auto segment = SharedSegment::create(3 * 4096);
  const int fd = shared_mapping_descriptor(segment->data(), segment->size());
  ASSERT_GE(fd, 0);
  struct stat found {
  }, own{};
  ASSERT_EQ(::fstat(fd, &found), 0);
  ASSERT_EQ(::fstat(segment->fd(), &own), 0);
  EXPECT_EQ(found.st_ino, own.st_ino);
  EXPECT_EQ(found.st_dev, own.st_dev);
  // Not the start of the mapping, more bytes than the file holds, private
  // or anonymous memory: none.
  EXPECT_EQ(shared_mapping_descriptor(segment->data() + 4096, 4096), -1);
  EXPECT_EQ(shared_mapping_descriptor(segment->data(), segment->size() + 1), -1);
  auto private_view = SharedSegment::attach(segment->attach_path(), true, true);
  EXPECT_EQ(shared_mapping_descriptor(private_view->data(), 4096), -1);
  void* anonymous =
      ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(anonymous, MAP_FAILED);
  EXPECT_EQ(shared_mapping_descriptor(anonymous, 4096), -1);
  ::munmap(anonymous, 4096);
}

// Page faults this thread took so far (minor: the page was in memory).
long minor_faults_of_this_thread() {
  rusage usage{};
  ::getrusage(RUSAGE_THREAD, &usage);
  return usage.ru_minflt;
}

constexpr size_t kWriteChunk = 1 << 20;

// The faults taken while write() fills every byte of `segment` with `value`,
// a chunk at a time as a batch's samples are.
long faults_writing(SharedSegment& segment, unsigned char value) {
  const std::vector<unsigned char> chunk(kWriteChunk, value);
  const long before = minor_faults_of_this_thread();
  for (size_t offset = 0; offset < segment.size(); offset += kWriteChunk) {
    segment.write(offset, chunk.data(), std::min(kWriteChunk, segment.size() - offset));
  }
  return minor_faults_of_this_thread() - before;
}

bool holds_only(const SharedSegment& segment, unsigned char value) {
  for (size_t i = 0; i < segment.size(); ++i) {
    if (static_cast<unsigned char>(segment.data()[i]) != value) return false;
  }
  return true;
}

// A segment made here is written through its file: its pages are filled
// without a fault per 4 KiB page (nor zeroed first), and the mapping sees
// them. One attached from another process is written through the mapping.
TEST(SharedSegmentTest, ASegmentMadeHereIsWrittenWithoutAFaultPerPage) {
  constexpr size_t kBytes = 32 << 20;
  constexpr long kPages = kBytes / 4096;
  auto segment = SharedSegment::create(kBytes);
  EXPECT_LT(faults_writing(*segment, 0x5a), kPages / 64);
  EXPECT_TRUE(holds_only(*segment, 0x5a));

  auto arena = SharedArena::create();
  auto range = arena->allocate(kBytes);
  EXPECT_LT(faults_writing(*range, 0x17), kPages / 64);
  EXPECT_TRUE(holds_only(*range, 0x17));
  auto unreserved = arena->allocate(kBytes, SharedSegment::Reserve::kLater);
  EXPECT_LT(faults_writing(*unreserved, 0x23), kPages / 64);
  EXPECT_TRUE(holds_only(*unreserved, 0x23));

  // The yardstick the checks above would fail against: the same pages
  // written through a mapping take a fault each.
  auto attached = SharedSegment::attach(segment->attach_path());
  EXPECT_GE(faults_writing(*attached, 0x66), kPages / 2);
  EXPECT_TRUE(holds_only(*segment, 0x66));
}

TEST(SharedSegmentTest, FullDirectoryIsAClearErrorNotSigbus) {
  testing::TempDir dir;
  if (::mount("tmpfs", dir.path().c_str(), "tmpfs", 0, "size=1m") != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs here (" << std::strerror(errno)
                 << "); needs root or CAP_SYS_ADMIN";
  }
  try {
    SharedSegment::create(8 << 20, dir.path());
    ADD_FAILURE() << "expected ENOSPC";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    EXPECT_EQ(e.error_number(), ENOSPC);
    const std::string message = e.what();
    EXPECT_NE(message.find(dir.path()), std::string::npos) << message;
    EXPECT_NE(message.find("8388608 bytes"), std::string::npos) << message;
    EXPECT_NE(message.find("free of"), std::string::npos) << message;
  }
  EXPECT_EQ(entries_in(dir.path()), 0u);  // the failed reservation left nothing
  // Pages never reserved, written through the file: the same clear error.
  auto range = SharedArena::create(dir.path())->allocate(2 << 20, SharedSegment::Reserve::kLater);
  const std::vector<char> bytes(2 << 20, 1);
  try {
    range->write(0, bytes.data(), bytes.size());
    ADD_FAILURE() << "expected ENOSPC";
  } catch (const Error& e) {
    EXPECT_EQ(e.error_number(), ENOSPC);
    EXPECT_NE(std::string(e.what()).find(dir.path()), std::string::npos) << e.what();
  }
  range.reset();
  ::umount(dir.path().c_str());
}

TEST(SlotPoolTest, SlotsCycleThroughHoldAndRelease) {
  auto pool = SlotPool::create(1000, 3);
  EXPECT_EQ(pool->slot_bytes(), 4096u);  // page-aligned slots
  EXPECT_EQ(pool->segment()->size(), 3u * 4096u);
  auto a = pool->acquire();
  auto b = pool->acquire();
  auto c = pool->acquire();
  ASSERT_TRUE(a && b && c);
  EXPECT_FALSE(pool->acquire().has_value());
  EXPECT_EQ(pool->slots_in_use(), 3u);
  pool->release(*b);
  EXPECT_EQ(pool->slots_in_use(), 2u);
  {
    auto held = pool->hold(*a);
    EXPECT_EQ(held->data(), pool->segment()->data() + pool->slot_offset(*a));
    EXPECT_EQ(held->size(), 4096u);
    EXPECT_EQ(held->kind(), StorageKind::kPoolSlot);
    EXPECT_EQ(pool->slots_in_use(), 2u);
  }
  EXPECT_EQ(pool->slots_in_use(), 1u);               // the held slot came back with its last view
  EXPECT_THROW(pool->release(*a), InvalidArgument);  // already free
  EXPECT_THROW(pool->hold(7), InvalidArgument);
}

TEST(SlotPoolTest, HeldSlotKeepsPoolAlive) {
  std::shared_ptr<Storage> held;
  {
    auto pool = SlotPool::create(4096, 2);
    held = pool->hold(*pool->acquire());
  }
  std::memset(held->data(), 1, held->size());  // still mapped
  SUCCEED();
}

TEST(SlotPoolTest, AdoptWrapsASegmentAnotherProcessCreated) {
  // A worker creates a segment sized to its batch; the main process attaches
  // it through /proc and adopts it as a one-slot pool that recycles.
  auto created = SharedSegment::create(3 * 4096);
  const char message[] = "batch bytes";
  created->write(0, message, sizeof(message));
  auto attached = SharedSegment::attach(created->attach_path());
  auto pool = SlotPool::adopt(attached, attached->size(), 1);
  EXPECT_EQ(pool->slot_bytes(), 3u * 4096u);
  auto slot = pool->acquire();
  ASSERT_TRUE(slot.has_value());
  EXPECT_FALSE(pool->acquire().has_value());
  {
    auto held = pool->hold(*slot);
    EXPECT_EQ(std::memcmp(held->data(), message, sizeof(message)), 0);
  }
  EXPECT_EQ(pool->slots_in_use(), 0u);
  EXPECT_THROW(SlotPool::adopt(attached, 4096, 4), InvalidArgument);  // 4 pages > 3
  EXPECT_THROW(SlotPool::adopt(attached, 0, 1), InvalidArgument);
  EXPECT_THROW(SlotPool::adopt(nullptr, 4096, 1), InvalidArgument);
}

TEST(SlotPoolTest, ZeroSizesAreRejected) {
  EXPECT_THROW(SlotPool::create(0, 2), InvalidArgument);
  EXPECT_THROW(SlotPool::create(10, 0), InvalidArgument);
}

}  // namespace
}  // namespace leanloader
