// SharedCopy: real malloc blocks, real mappings, /proc/self/maps and
// smaps_rollup read back.
#include "leanloader/workers/shared_copy.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "leanloader/core/error.h"
#include "test_util.h"
#include "workers/held_writes.h"
#include "workers/written_pages.h"

namespace leanloader {
namespace {

using testing::kPage;

void fill(void* block, size_t bytes, uint8_t salt) {
  auto* p = static_cast<uint8_t*>(block);
  for (size_t i = 0; i < bytes; ++i) p[i] = static_cast<uint8_t>(i * 131 + salt + (i >> 12));
}

bool has_pattern(const void* block, size_t bytes, uint8_t salt) {
  const auto* p = static_cast<const uint8_t*>(block);
  for (size_t i = 0; i < bytes; ++i) {
    if (p[i] != static_cast<uint8_t>(i * 131 + salt + (i >> 12))) return false;
  }
  return true;
}

// A field of this process's /proc/self/smaps_rollup ("Anonymous",
// "Pss_Shmem", ...), in bytes.
size_t rollup_bytes(const std::string& field) {
  std::ifstream rollup("/proc/self/smaps_rollup");
  std::string line;
  while (std::getline(rollup, line)) {
    if (line.rfind(field + ":", 0) == 0) {
      std::istringstream fields(line.substr(field.size() + 1));
      size_t kib = 0;
      fields >> kib;
      return kib << 10;
    }
  }
  return 0;
}

size_t anonymous_bytes() { return rollup_bytes("Anonymous"); }

// The /proc/self/maps line of the mapping that holds `address`.
std::string mapping_of(const void* address) {
  const auto a = reinterpret_cast<uintptr_t>(address);
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    const size_t dash = line.find('-');
    const size_t space = line.find(' ');
    const uintptr_t start = std::stoull(line.substr(0, dash), nullptr, 16);
    const uintptr_t end = std::stoull(line.substr(dash + 1, space - dash - 1), nullptr, 16);
    if (a >= start && a < end) return line;
  }
  return "";
}

// Why page sharing cannot happen in this process at all, or "": the
// sanitizer builds replace malloc, and there every copy is a plain one.
std::string allocator_refusal() {
  const size_t bytes = 64 << 20;
  void* probe = std::calloc(bytes, 1);
  const std::string why = page_sharing_refusal(probe, bytes);
  std::free(probe);
  return why.find("allocator") != std::string::npos ? why : "";
}

TEST(SharedCopyTest, APlainCopyHoldsTheBytesAtTheSourcesPageOffset) {
  const size_t bytes = (3 << 20) + 123;
  auto* block = static_cast<std::byte*>(std::malloc(bytes + 64));
  ASSERT_NE(block, nullptr);
  std::byte* source = block + 40;  // not page-aligned
  fill(source, bytes, 1);
  const std::string before = mapping_of(source + kPage);
  SharedCopy copy = make_shared_copy(source, bytes, "", PageSharing::kOff);
  EXPECT_EQ(copy.shared_bytes, 0u);
  EXPECT_EQ(copy.offset, reinterpret_cast<uintptr_t>(source) % kPage);
  EXPECT_EQ(copy.segment->size(), copy.offset + bytes);
  EXPECT_TRUE(has_pattern(copy.segment->data() + copy.offset, bytes, 1));
  EXPECT_EQ(mapping_of(source + kPage), before);  // the source's pages are its own
  std::free(block);
}

TEST(SharedCopyTest, AMallocMappedBlockIsMappedFromItsCopyWithoutASecondCopy) {
  const size_t bytes = (150 << 20) + 777;  // above malloc's mmap threshold; three chunks
  if (const std::string why = allocator_refusal(); !why.empty()) GTEST_SKIP() << why;
  auto* source = static_cast<std::byte*>(std::malloc(bytes));
  ASSERT_NE(source, nullptr);
  fill(source, bytes, 2);
  ASSERT_EQ(page_sharing_refusal(source, bytes), "");
  const size_t anonymous_before = anonymous_bytes();
  SharedCopy copy = make_shared_copy(source, bytes, "", PageSharing::kWhereSafe);
  // The source's page tables map the copy's pages already (no fault on the
  // next read, and PSS counts them), without copying any: with the
  // segment's own mapping gone, they are still this process's shared memory.
  const size_t shmem_with_segment = rollup_bytes("Pss_Shmem");
  {
    auto attached = SharedSegment::attach(copy.segment->attach_path(), false);
    copy.segment.reset();
    EXPECT_GE(rollup_bytes("Pss_Shmem") + (16 << 20), shmem_with_segment);
    EXPECT_GE(rollup_bytes("Pss_Shmem") + (16 << 20), bytes);
    EXPECT_LT(anonymous_bytes() + bytes - (16 << 20), anonymous_before);
    copy.segment = attached;  // (a read-only view of the copy, for the checks below)
  }

  const auto address = reinterpret_cast<uintptr_t>(source);
  const size_t interior = (address + bytes) / kPage * kPage - (address + kPage - 1) / kPage * kPage;
  EXPECT_EQ(copy.shared_bytes, interior);
  EXPECT_TRUE(has_pattern(source, bytes, 2));  // the same bytes at the same addresses
  EXPECT_TRUE(has_pattern(copy.segment->data() + copy.offset, bytes, 2));
  const std::string mapping = mapping_of(source + bytes / 2);
  EXPECT_NE(mapping.find("/memfd:leanloader-"), std::string::npos) << mapping;
  EXPECT_NE(mapping.find(" rw-p "), std::string::npos) << mapping;
  // The source's anonymous pages went back to the kernel (less the two
  // partial pages at its ends and whatever else the process did meanwhile).
  EXPECT_LT(anonymous_bytes() + bytes - (16 << 20), anonymous_before)
      << anonymous_before << " -> " << anonymous_bytes();

  // Writes stay private to this process: the copy (what workers map) keeps
  // the bytes it was made with.
  source[bytes / 2] = std::byte{0x5a};
  source[10] = std::byte{0x5b};
  EXPECT_EQ(source[bytes / 2], std::byte{0x5a});
  EXPECT_TRUE(has_pattern(copy.segment->data() + copy.offset, bytes, 2));

  // free() unmaps the whole block (the file mapping with it); the copy stays.
  const auto middle = reinterpret_cast<uintptr_t>(source) + bytes / 2;
  std::free(source);
  EXPECT_EQ(mapping_of(reinterpret_cast<const void*>(middle)).find("leanloader-"),
            std::string::npos);
  EXPECT_TRUE(has_pattern(copy.segment->data() + copy.offset, bytes, 2));
}

TEST(SharedCopyTest, NoWriteOfAnotherThreadIsLostWhileThePagesAreMapped) {
  // A thread adds 1 to every word, pass after pass, while the block's pages
  // are copied and mapped from the copy. A write landing on a page after its
  // copy and before its mapping would be lost; held writes wait instead.
  if (const std::string why = allocator_refusal(); !why.empty()) GTEST_SKIP() << why;
  const size_t words = (200 << 20) / sizeof(uint64_t);  // four chunks
  auto* block = static_cast<uint64_t*>(std::calloc(words, sizeof(uint64_t)));
  ASSERT_NE(block, nullptr);
  std::atomic<bool> stop{false};
  std::atomic<size_t> passes{0};
  std::atomic<size_t> stopped_at{words};
  std::thread writer([&] {
    for (;;) {
      for (size_t i = 0; i < words; ++i) {
        if ((i & 4095) == 0 && stop.load(std::memory_order_relaxed)) {
          stopped_at = i;
          return;
        }
        volatile uint64_t* word = block + i;
        *word = *word + 1;
      }
      passes.fetch_add(1);
    }
  });
  while (passes.load() == 0) std::this_thread::yield();  // the writer is well under way
  std::vector<SharedCopy> copies;  // shared again and again: each time the writer is at work
  for (int i = 0; i < 4; ++i) {
    copies.push_back(
        make_shared_copy(block, words * sizeof(uint64_t), "", PageSharing::kWhereSafe));
  }
  const size_t passes_during = passes.load();
  while (passes.load() < passes_during + 1) std::this_thread::yield();
  stop = true;
  writer.join();
  for (const SharedCopy& copy : copies) EXPECT_GT(copy.shared_bytes, 0u);
  size_t lost = 0;
  for (size_t i = 0; i < words; ++i) {
    lost += block[i] != passes.load() + (i < stopped_at.load() ? 1 : 0);
  }
  EXPECT_EQ(lost, 0u) << "of " << words << " words, after " << passes.load() << " passes";
  std::free(block);
}

TEST(SharedCopyTest, FaultsOutsideAHeldRangeStillReachTheEarlierHandler) {
  // A write to read-only memory that no copy holds is still a SIGSEGV for
  // whatever handled it before (here: the default action, in a child).
  if (const std::string why = allocator_refusal(); !why.empty()) GTEST_SKIP() << why;
  const size_t bytes = 64 << 20;
  void* block = std::calloc(bytes, 1);
  ASSERT_NE(block, nullptr);
  SharedCopy copy = make_shared_copy(block, bytes, "", PageSharing::kWhereSafe);  // installs ours
  ASSERT_GT(copy.shared_bytes, 0u);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    void* page = ::mmap(nullptr, kPage, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    *static_cast<volatile int*>(page) = 1;
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV) << status;
  std::free(block);
}

TEST(SharedCopyTest, AChildForkedDuringAHoldCanWriteTheRange) {
  // Another thread may fork while a chunk is held: the child's copy of the
  // range must be writable (nothing ends the hold there), not a wait forever.
  void* range =
      ::mmap(nullptr, 16 * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(range, MAP_FAILED);
  pid_t child = -1;
  {
    detail::HeldWrites hold(reinterpret_cast<uintptr_t>(range), 16 * kPage);
    ASSERT_TRUE(hold.held());
    child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      ::alarm(10);  // a hang becomes SIGALRM
      static_cast<volatile char*>(range)[5 * kPage] = 1;
      ::_exit(static_cast<volatile char*>(range)[5 * kPage] == 1 ? 0 : 3);
    }
    hold.restore_write_access();  // (here the pages are not replaced: keep them)
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  static_cast<volatile char*>(range)[5 * kPage] = 2;  // writable here too once released
  ::munmap(range, 16 * kPage);
}

TEST(SharedCopyTest, ASharedBlockCanBeSharedAgainAndReallocatedAndFreed) {
  const size_t bytes = 40 << 20;
  if (const std::string why = allocator_refusal(); !why.empty()) GTEST_SKIP() << why;
  auto* source = static_cast<std::byte*>(std::malloc(bytes));
  ASSERT_NE(source, nullptr);
  fill(source, bytes, 3);
  ASSERT_EQ(page_sharing_refusal(source, bytes), "");
  {
    SharedCopy first = make_shared_copy(source, bytes, "", PageSharing::kWhereSafe);
    ASSERT_GT(first.shared_bytes, 0u);
    // A second loader over the same array: its pages move to the new copy,
    // and the first copy's memory goes once nothing maps it.
    SharedCopy second = make_shared_copy(source, bytes, "", PageSharing::kWhereSafe);
    EXPECT_EQ(second.shared_bytes, first.shared_bytes);
    EXPECT_TRUE(has_pattern(second.segment->data() + second.offset, bytes, 3));
  }
  EXPECT_TRUE(has_pattern(source, bytes, 3));
  // realloc cannot mremap a block of several mappings; glibc copies it.
  auto* grown = static_cast<std::byte*>(std::realloc(source, bytes * 2));
  ASSERT_NE(grown, nullptr);
  EXPECT_TRUE(has_pattern(grown, bytes, 3));
  std::memset(grown + bytes, 0, bytes);
  std::free(grown);
}

TEST(SharedCopyTest, WorkersSeeTheBytesAndNotTheParentsLaterWrites) {
  const size_t bytes = 48 << 20;
  auto* source = static_cast<std::byte*>(std::malloc(bytes));
  ASSERT_NE(source, nullptr);
  fill(source, bytes, 4);
  SharedCopy copy = make_shared_copy(source, bytes, "", PageSharing::kWhereSafe);
  if (allocator_refusal().empty()) {
    EXPECT_GT(copy.shared_bytes, 0u);
  }
  source[kPage * 3] = std::byte{0};  // after the copy: not the workers' business
  const std::string path = copy.segment->attach_path();
  const size_t offset = copy.offset;
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto attached = SharedSegment::attach(path, false, true);
    ::_exit(has_pattern(attached->data() + offset, bytes, 4) ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  std::free(source);
}

// Writes a byte as the program would, so that the page it is on becomes a
// private (anonymous) copy even when the value is the same.
void write_byte(std::byte* at, std::byte value) {
  *reinterpret_cast<volatile std::byte*>(at) = value;
}

TEST(SharedCopyTest, ACopyStaysCurrentUntilAByteDiffersWhereverItIsWritten) {
  if (const std::string why = allocator_refusal(); !why.empty()) GTEST_SKIP() << why;
  const size_t bytes = (40 << 20) + 777;  // ends mid-page at both ends
  auto* source = static_cast<std::byte*>(std::malloc(bytes));
  ASSERT_NE(source, nullptr);
  fill(source, bytes, 6);
  SharedCopy shared = make_shared_copy(source, bytes, "", PageSharing::kWhereSafe);
  ASSERT_GT(shared.shared_bytes, 0u);
  const std::byte* copy = shared.segment->data() + shared.offset;
  // Told from the page tables (nothing written yet), and the same verdict as
  // a compare of every byte in each case below.
  ASSERT_EQ(detail::equal_where_written(source, copy, bytes), std::optional<bool>(true));
  EXPECT_TRUE(copy_is_current(source, copy, bytes));

  for (const size_t at : {size_t{10}, bytes / 2, bytes - 1}) {  // head page, interior, tail page
    const std::byte before = source[at];
    write_byte(source + at, before);  // written, but the same bytes
    EXPECT_EQ(detail::equal_where_written(source, copy, bytes), std::optional<bool>(true)) << at;
    EXPECT_TRUE(copy_is_current(source, copy, bytes)) << at;
    write_byte(source + at, before ^ std::byte{1});
    EXPECT_EQ(detail::equal_where_written(source, copy, bytes), std::optional<bool>(false)) << at;
    EXPECT_FALSE(copy_is_current(source, copy, bytes)) << at;
    write_byte(source + at, before);
    EXPECT_TRUE(copy_is_current(source, copy, bytes)) << at;
  }
  // Another copy of the same bytes is not the source's pages: every byte is compared.
  SharedCopy plain = make_shared_copy(source, bytes, "", PageSharing::kOff);
  const std::byte* other = plain.segment->data() + plain.offset;
  EXPECT_EQ(detail::equal_where_written(source, other, bytes), std::nullopt);
  EXPECT_TRUE(copy_is_current(source, other, bytes));
  // Told that no pages were shared, the same verdicts from every byte.
  EXPECT_TRUE(copy_is_current(source, other, bytes, /*pages_shared=*/false));
  EXPECT_TRUE(copy_is_current(source, copy, bytes, /*pages_shared=*/false));
  write_byte(source + bytes / 3, source[bytes / 3] ^ std::byte{1});
  EXPECT_FALSE(copy_is_current(source, other, bytes));
  EXPECT_FALSE(copy_is_current(source, other, bytes, /*pages_shared=*/false));
  EXPECT_FALSE(copy_is_current(source, copy, bytes, /*pages_shared=*/false));
  std::free(source);
}

TEST(SharedCopyTest, BlocksThatAreNotWholeMallocMappedBlocksGetAPlainCopy) {
  // Inside a larger block (the bytes before it are data, not a header).
  const size_t bytes = 40 << 20;
  auto* block = static_cast<std::byte*>(std::calloc(bytes, 1));
  ASSERT_NE(block, nullptr);
  std::byte* inner = block + kPage * 4;
  EXPECT_NE(page_sharing_refusal(inner, bytes / 2), "");
  SharedCopy copy = make_shared_copy(inner, bytes / 2, "", PageSharing::kWhereSafe);
  EXPECT_EQ(copy.shared_bytes, 0u);
  EXPECT_EQ(mapping_of(inner + kPage).find("leanloader-"), std::string::npos);
  // Longer than the block malloc made.
  EXPECT_NE(page_sharing_refusal(block, bytes + (1 << 20)), "");
  std::free(block);

  // A small block from malloc's heap.
  auto* small = static_cast<std::byte*>(std::malloc(2048));
  ASSERT_NE(small, nullptr);
  EXPECT_NE(page_sharing_refusal(small, 2048), "");
  std::free(small);

  // Memory malloc did not make: an anonymous mapping with a header-shaped
  // prefix is refused by the allocator or the header rules...
  const size_t mapped_bytes = 8 << 20;
  void* raw =
      ::mmap(nullptr, mapped_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(raw, MAP_FAILED);
  auto* words = static_cast<size_t*>(raw);
  words[0] = 0;
  words[1] = mapped_bytes | 1;  // PREV_INUSE: a heap chunk's header, not a mmapped one
  EXPECT_NE(page_sharing_refusal(words + 2, mapped_bytes - 16), "");
  // ... and a read-only one by its protection.
  words[1] = mapped_bytes | 2;
  ASSERT_EQ(::mprotect(raw, mapped_bytes, PROT_READ), 0);
  EXPECT_NE(page_sharing_refusal(words + 2, mapped_bytes - 16), "");
  ::munmap(raw, mapped_bytes);

  // A file mapping.
  testing::TempDir dir;
  const std::string file = dir.file("data.bin");
  std::ofstream(file) << std::string(1 << 20, 'x');
  const int fd = ::open(file.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  void* file_map = ::mmap(nullptr, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  ::close(fd);
  ASSERT_NE(file_map, MAP_FAILED);
  EXPECT_NE(page_sharing_refusal(static_cast<std::byte*>(file_map) + 16, (1 << 20) - 16), "");
  ::munmap(file_map, 1 << 20);
}

TEST(SharedCopyTest, AFullDirectoryIsAClearErrorAndLendsItNoPagesOfTheSource) {
  testing::TempDir dir;
  if (::mount("tmpfs", dir.path().c_str(), "tmpfs", 0, "size=80m") != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs here (" << std::strerror(errno)
                 << "); needs root or CAP_SYS_ADMIN";
  }
  const size_t bytes = 150 << 20;
  auto* source = static_cast<std::byte*>(std::malloc(bytes));
  ASSERT_NE(source, nullptr);
  fill(source, bytes, 5);
  try {
    make_shared_copy(source, bytes, dir.path(), PageSharing::kWhereSafe);
    ADD_FAILURE() << "expected ENOSPC";
  } catch (const Error& e) {
    EXPECT_EQ(e.error_number(), ENOSPC);
    EXPECT_NE(std::string(e.what()).find(dir.path()), std::string::npos) << e.what();
  }
  // The copy could not fit, so no page of the source was mapped from it:
  // the directory holds nothing (it unmounts) and the source its bytes.
  EXPECT_EQ(mapping_of(source + kPage * 2).find("leanloader-"), std::string::npos);
  EXPECT_EQ(::umount(dir.path().c_str()), 0) << std::strerror(errno);
  EXPECT_TRUE(has_pattern(source, bytes, 5));
  std::free(source);
}

TEST(SharedCopyTest, AFileSystemOtherThanTmpfsGetsAPlainCopy) {
  if (const std::string why = allocator_refusal(); !why.empty()) GTEST_SKIP() << why;
  testing::TempDir dir;  // under TMPDIR, not /dev/shm
  struct statfs file_system {};
  ASSERT_EQ(::statfs(dir.path().c_str(), &file_system), 0);
  if (static_cast<uint64_t>(file_system.f_type) == TMPFS_MAGIC) {
    GTEST_SKIP() << dir.path() << " is on tmpfs here";
  }
  const size_t bytes = 40 << 20;
  auto* source = static_cast<std::byte*>(std::malloc(bytes));
  ASSERT_NE(source, nullptr);
  fill(source, bytes, 6);
  ASSERT_EQ(page_sharing_refusal(source, bytes), "");
  SharedCopy copy = make_shared_copy(source, bytes, dir.path(), PageSharing::kWhereSafe);
  EXPECT_EQ(copy.shared_bytes, 0u);
  EXPECT_TRUE(has_pattern(copy.segment->data() + copy.offset, bytes, 6));
  std::free(source);
}

}  // namespace
}  // namespace leanloader
