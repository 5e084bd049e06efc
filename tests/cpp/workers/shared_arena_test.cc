// SharedArena: many segments in one file, descriptors counted in
// /proc/self/fd, pages counted in the file's st_blocks, real forks.
#include "leanloader/workers/shared_arena.h"

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "leanloader/core/error.h"
#include "leanloader/workers/shared_copy.h"
#include "test_util.h"

namespace leanloader {
namespace {

size_t open_descriptors() {
  size_t n = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    (void)entry;
    ++n;
  }
  return n;
}

// Bytes of memory the arena's file holds.
size_t held_bytes(const SharedArena& arena) {
  struct stat st {};
  EXPECT_EQ(::fstat(arena.fd(), &st), 0);
  return static_cast<size_t>(st.st_blocks) * 512;
}

using testing::kPage;

TEST(SharedArenaTest, AThousandSegmentsCostOneDescriptorHereAndInAnAttacher) {
  auto arena = SharedArena::create();
  const size_t before = open_descriptors();
  std::vector<std::shared_ptr<SharedSegment>> segments;
  for (int i = 0; i < 1500; ++i) {
    segments.push_back(arena->allocate(1000 + static_cast<size_t>(i)));
    std::memset(segments.back()->data(), i % 251, segments.back()->size());
  }
  EXPECT_EQ(open_descriptors(), before);  // the arena's own, opened before
  for (size_t i = 0; i < segments.size(); ++i) {
    EXPECT_EQ(segments[i]->file_offset() % kPage, 0u);
    EXPECT_EQ(segments[i]->fd(), arena->fd());
    if (i > 0) {
      EXPECT_GE(segments[i]->file_offset(), segments[i - 1]->file_offset() + kPage);
    }
  }
  // Attaching every range (as a worker does) through the owner's path: one
  // more descriptor for all of them, each range its own bytes.
  std::vector<std::shared_ptr<SharedSegment>> attached;
  for (const auto& segment : segments) {
    attached.push_back(SharedSegment::attach(segment->attach_path(), true, true,
                                             segment->file_offset(), segment->size()));
  }
  EXPECT_EQ(open_descriptors(), before + 1);
  for (size_t i = 0; i < attached.size(); ++i) {
    ASSERT_EQ(attached[i]->size(), segments[i]->size());
    EXPECT_EQ(static_cast<int>(attached[i]->data()[attached[i]->size() - 1]),
              static_cast<int>(i % 251));
  }
  attached.clear();
  EXPECT_EQ(open_descriptors(), before);
}

TEST(SharedArenaTest, AnAttachOutsideTheFileOrUnalignedIsRefused) {
  auto arena = SharedArena::create();
  auto segment = arena->allocate(3 * kPage);
  EXPECT_THROW(SharedSegment::attach(segment->attach_path(), false, false, 1, 10), InvalidArgument);
  EXPECT_THROW(SharedSegment::attach(segment->attach_path(), false, false, 0, 4 * kPage),
               InvalidArgument);
  EXPECT_THROW(arena->allocate(0), InvalidArgument);
}

TEST(SharedArenaTest, AReleasedRangeGivesItsPagesBack) {
  auto arena = SharedArena::create();
  auto kept = arena->allocate(1 << 20);
  std::memset(kept->data(), 5, kept->size());
  auto dropped = arena->allocate(8 << 20);
  std::memset(dropped->data(), 6, dropped->size());
  EXPECT_GE(held_bytes(*arena), size_t{9} << 20);
  dropped.reset();
  EXPECT_LE(held_bytes(*arena), (size_t{1} << 20) + kPage);
  EXPECT_EQ(arena->held_back_ranges(), 0u);
  EXPECT_EQ(static_cast<int>(kept->data()[12345]), 5);
  // Ranges are not reused: a new segment starts past every earlier one.
  auto next = arena->allocate(100);
  EXPECT_GE(next->file_offset(), size_t{9} << 20);
  EXPECT_EQ(static_cast<int>(next->data()[0]), 0);
}

bool glibc_malloc() {
  void* libc = ::dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
  const bool same = libc != nullptr && ::dlsym(libc, "malloc") == ::dlsym(RTLD_DEFAULT, "malloc");
  if (libc != nullptr) ::dlclose(libc);
  return same;
}

TEST(SharedArenaTest, ARangeMappedPrivatelyIsHeldUntilNoMappingReadsIt) {
  // A page-shared copy: the block's own pages are the range's file pages.
  // Punching the range while the block lives would turn its bytes to zeros.
  if (!glibc_malloc()) GTEST_SKIP() << "page sharing needs glibc's malloc";
  const size_t bytes = 64 << 20;
  auto* block = static_cast<std::byte*>(std::malloc(bytes));
  ASSERT_NE(block, nullptr);
  std::memset(block, 9, bytes);
  auto arena = SharedArena::create();
  SharedCopy copy = make_shared_copy(block, bytes, *arena, PageSharing::kWhereSafe);
  if (copy.shared_bytes == 0) GTEST_SKIP() << page_sharing_refusal(block, bytes);
  copy.segment.reset();
  EXPECT_EQ(arena->held_back_ranges(), 1u);
  EXPECT_EQ(static_cast<int>(block[bytes / 2]), 9);
  EXPECT_EQ(static_cast<int>(block[bytes - 1]), 9);
  EXPECT_GE(held_bytes(*arena), bytes - 2 * kPage);
  std::free(block);                    // glibc unmaps the block: nothing reads the range now
  auto next = arena->allocate(kPage);  // the next allocation punches it
  EXPECT_EQ(arena->held_back_ranges(), 0u);
  EXPECT_LE(held_bytes(*arena), 2 * kPage);
}

TEST(SharedArenaTest, ARangeThatExistedAtAForkIsNeverPunched) {
  auto arena = SharedArena::create();
  auto segment = arena->allocate(1 << 20);
  std::memset(segment->data(), 4, segment->size());
  const std::byte* inherited = segment->data();
  int go[2];
  ASSERT_EQ(::pipe(go), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    char byte = 0;
    const bool read_ok = ::read(go[0], &byte, 1) == 1;
    // The parent has dropped the segment: the inherited mapping still reads
    // the bytes (a punched range would read zeros).
    ::_exit(read_ok && static_cast<int>(inherited[(1 << 20) - 1]) == 4 ? 0 : 1);
  }
  segment.reset();
  auto next = arena->allocate(kPage);
  EXPECT_EQ(arena->held_back_ranges(), 1u);
  ASSERT_EQ(::write(go[1], "g", 1), 1);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ::close(go[0]);
  ::close(go[1]);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(SharedArenaTest, ARangeIsPunchedWhenTheForkedChildReadsNoReleasedRange) {
  // The fork server forked from the main process reads nothing the main
  // process releases: its fork is taken back, and released ranges are punched.
  auto arena = SharedArena::create();
  auto segment = arena->allocate(1 << 20);
  std::memset(segment->data(), 4, segment->size());
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) ::_exit(0);
  forget_fork_of_a_child_that_reads_no_released_range();
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  segment.reset();
  auto next = arena->allocate(kPage);
  EXPECT_EQ(arena->held_back_ranges(), 0u);
  EXPECT_LE(held_bytes(*arena), 2 * kPage);
}

}  // namespace
}  // namespace leanloader
