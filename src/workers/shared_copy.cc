#include "leanloader/workers/shared_copy.h"

#include <dlfcn.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <vector>

#include "core/page_size.h"
#include "io/proc_maps.h"
#include "leanloader/core/checked_size.h"
#include "leanloader/core/error.h"
#include "workers/held_writes.h"
#include "workers/written_pages.h"

namespace leanloader {

namespace {

// The copy is made, and the source's pages mapped from it, this much at a
// time: the source and its copy coexist for one chunk only.
constexpr size_t kChunkBytes = size_t{64} << 20;
// copy_is_current reads the page tables instead of comparing every byte from
// this size up (a compare of 4 MiB takes about as long as reading /proc's maps).
constexpr size_t kComparedByPagesBytes = size_t{4} << 20;
// glibc's chunk header: prev_size then size, each a size_t, before the
// pointer malloc returns. In the size, bit 1 is IS_MMAPPED, bit 0 PREV_INUSE
// and bit 2 NON_MAIN_ARENA (both clear for a mmapped chunk). For a mmapped
// chunk, prev_size is the chunk's offset in its mapping, and the mapping is
// offset + size long (glibc up to 2.41) or offset + size + the header (later
// glibc, where bit 0 of prev_size marks huge pages); mappings are
// page-aligned, so at most one of the two lengths is a multiple of the page.
constexpr size_t kChunkHeaderBytes = 2 * sizeof(size_t);
constexpr size_t kChunkFlagBits = 7;
constexpr size_t kMmappedChunkFlags = 2;
constexpr size_t kHugePageOffsetBit = 1;

using detail::page_size;

// True when this process's allocation functions are the C library's own:
// no preloaded allocator and no sanitizer runtime intercepts them.
bool glibc_allocates() {
  void* libc = ::dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
  if (libc == nullptr) return false;
  bool same = true;
  for (const char* name :
       {"malloc", "calloc", "free", "realloc", "posix_memalign", "memalign", "aligned_alloc"}) {
    void* own = ::dlsym(libc, name);
    same = same && own != nullptr && ::dlsym(RTLD_DEFAULT, name) == own;
  }
  ::dlclose(libc);
  return same;
}

using Mapping = detail::ProcessMapping;

// Private read-write memory whose pages may be replaced: anonymous (possibly
// named by the allocator), or the file of an earlier shared copy made by
// this process (a segment it created: memfd or unnamed tmpfs file).
bool replaceable(const Mapping& mapping) {
  if (mapping.perms != "rw-p") return false;
  if (mapping.path.empty() || mapping.path.rfind("[anon:", 0) == 0) return mapping.inode == 0;
  return mapping.inode != 0 && SharedSegment::mapped_privately_here(mapping.device, mapping.inode);
}

// "" when [start, end) is covered, without a gap, by replaceable mappings.
std::string coverage_refusal(const std::vector<Mapping>& mappings, uintptr_t start, uintptr_t end) {
  uintptr_t covered = start;
  for (const Mapping& mapping : mappings) {
    if (mapping.end <= covered) continue;
    if (mapping.start > covered) break;
    if (!replaceable(mapping)) {
      return "its memory is not private anonymous memory (" + mapping.perms + " " +
             (mapping.path.empty() ? std::string("anonymous") : mapping.path) + ")";
    }
    covered = mapping.end;
    if (covered >= end) return "";
  }
  return "its memory is not mapped as one block";
}

// The length of the mapping of a mmapped chunk whose header holds
// `prev_size` and `chunk_size` (see kChunkHeaderBytes), or nullopt.
std::optional<size_t> mmapped_chunk_length(size_t prev_size, size_t chunk_size) {
  const size_t page = page_size();
  const auto length = checked_add(prev_size, chunk_size);
  if (!length) return std::nullopt;
  if (*length % page == 0) return length;
  const auto with_header = checked_add(*length, kChunkHeaderBytes);
  if (with_header && *with_header % page == 0) return with_header;
  return std::nullopt;
}

std::string refusal(const void* source, size_t bytes, const std::vector<Mapping>& mappings) {
  if (!glibc_allocates()) {
    return "this process's allocator is not glibc's malloc (a preloaded allocator or a "
           "sanitizer)";
  }
  const auto address = reinterpret_cast<uintptr_t>(source);
  const auto end = checked_add(address, bytes);
  if (bytes == 0 || !end || address < kChunkHeaderBytes) return "the block is empty or wraps";
  if (address % alignof(size_t) != 0) return "the block is not where malloc puts a block";
  // The header is read only once its bytes are known to be mapped.
  std::string why = coverage_refusal(mappings, address - kChunkHeaderBytes, *end);
  if (!why.empty()) return why;
  size_t header[2];
  std::memcpy(header, reinterpret_cast<const std::byte*>(source) - kChunkHeaderBytes,
              sizeof(header));
  if ((header[1] & kChunkFlagBits) != kMmappedChunkFlags) {
    return "it is not a block that malloc mapped on its own (a mmapped chunk)";
  }
  const size_t prev_size = header[0] & ~kHugePageOffsetBit;
  const uintptr_t chunk_start = address - kChunkHeaderBytes;
  const auto length = mmapped_chunk_length(prev_size, header[1] & ~kChunkFlagBits);
  const uintptr_t block = chunk_start - prev_size;
  if (prev_size > chunk_start || !length || block % page_size() != 0 ||
      !checked_add(block, *length) || block + *length < *end) {
    return "its malloc header does not describe a mmapped chunk that holds it";
  }
  why = coverage_refusal(mappings, block, block + *length);
  if (!why.empty()) return why;
  // A MAP_FIXED that fails may leave the range unmapped on kernels before
  // 6.12 (make_shared_copy then restores it from the copy); stay far from
  // the one limit a small mapping meets, which the rest of the process needs
  // too.
  std::ifstream limit_file("/proc/sys/vm/max_map_count");
  size_t limit = 65530;  // the kernel's default
  limit_file >> limit;
  if (mappings.size() * 2 > limit) {
    return "this process uses more than half of its mappings (vm.max_map_count)";
  }
  return "";
}

// After a failed MAP_FIXED over [address, address + bytes): kernels before
// 6.12 may have unmapped the range before failing. Such a range gets
// anonymous memory again, with its bytes from the copy; if even that fails
// the process cannot go on (the block's owner would fault on its own memory).
void restore_if_unmapped(uintptr_t address, size_t bytes, const std::byte* copy) {
  void* start = reinterpret_cast<void*>(address);
  if (::msync(start, bytes, MS_ASYNC) == 0 || errno != ENOMEM) return;  // still mapped
  void* restored =
      ::mmap(start, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
  if (restored == MAP_FAILED) {
    std::fprintf(stderr,
                 "leanloader: a failed mmap unmapped %zu bytes of an array at %p, and they "
                 "cannot be mapped again (%s)\n",
                 bytes, start, std::strerror(errno));
    std::abort();
  }
  std::memcpy(restored, copy, bytes);
}

// True when the source's pages may become the segment's file pages for the
// source's lifetime: the segment is on tmpfs (on a disk file system they
// would be paged from disk), and the whole copy fits, so that a directory
// that fills up stops a plain copy (whose space comes back with the error),
// not one that has already lent some of the source's pages to the directory.
// Maps the page-table entries of a fresh private file mapping to the file's
// pages without copying them: the source's owner then reads them without a
// page fault each, and the process's PSS counts them (a mapping without
// entries counts nothing, and once the segment's own mapping is gone the
// pages would be counted nowhere). MAP_POPULATE would not do: on a private
// writable mapping it write-faults every page, which copies it.
void map_page_tables(uintptr_t address, size_t bytes) {
#ifdef MADV_POPULATE_READ
  if (::madvise(reinterpret_cast<void*>(address), bytes, MADV_POPULATE_READ) == 0) return;
#endif
  const size_t page = page_size();  // kernels before 5.14: read a byte of each page
  for (size_t at = 0; at < bytes; at += page) {
    (void)*reinterpret_cast<const volatile std::byte*>(address + at);
  }
}

bool segment_can_hold_the_pages(const SharedSegment& segment) {
  struct statfs file_system {};
  struct statvfs space {};
  // A memfd's file system reports no blocks at all: it has no size limit.
  return ::fstatfs(segment.fd(), &file_system) == 0 &&
         static_cast<uint64_t>(file_system.f_type) == TMPFS_MAGIC &&
         ::fstatvfs(segment.fd(), &space) == 0 &&
         (space.f_blocks == 0 || uint64_t{space.f_bavail} * space.f_frsize >= segment.size());
}

}  // namespace

bool copy_is_current(const void* source, const void* copy, size_t bytes, bool pages_shared) {
  if (source == copy || bytes == 0) return true;
  // A page-shared copy: only the pages written since are compared
  // (written_pages.h); below a few MiB, reading /proc costs more than that.
  if (pages_shared && bytes >= kComparedByPagesBytes) {
    if (const auto equal = detail::equal_where_written(source, copy, bytes)) return *equal;
  }
  return std::memcmp(source, copy, bytes) == 0;
}

std::string page_sharing_refusal(const void* source, size_t bytes) {
  return refusal(source, bytes, detail::read_process_mappings());
}

std::vector<std::string> page_sharing_refusals(
    const std::vector<std::pair<const void*, size_t>>& blocks) {
  const std::vector<Mapping> mappings = detail::read_process_mappings();
  std::vector<std::string> reasons;
  reasons.reserve(blocks.size());
  for (const auto& [source, bytes] : blocks) reasons.push_back(refusal(source, bytes, mappings));
  return reasons;
}

SharedCopy make_shared_copy(void* source, size_t bytes, const std::string& dir,
                            PageSharing sharing) {
  return make_shared_copy(source, bytes, *SharedArena::create(dir), sharing);
}

SharedCopy make_shared_copy(void* source, size_t bytes, SharedArena& arena, PageSharing sharing) {
  if (bytes == 0) throw InvalidArgument("a shared copy needs at least one byte");
  const size_t page = page_size();
  const auto address = reinterpret_cast<uintptr_t>(source);
  SharedCopy copy;
  copy.offset = address % page;
  const auto segment_bytes = checked_add(copy.offset, bytes);
  if (!segment_bytes || !checked_add(address, bytes)) {
    throw InvalidArgument("a shared copy of " + std::to_string(bytes) + " bytes wraps");
  }
  bool share = sharing == PageSharing::kWhereSafe &&
               refusal(source, bytes, detail::read_process_mappings()).empty();
  copy.segment = arena.allocate(*segment_bytes, SharedSegment::Reserve::kLater);
  SharedSegment& segment = *copy.segment;
  share = share && segment_can_hold_the_pages(segment);
  if (share) SharedSegment::remember_mapped_privately(segment);
  // Segment offset x holds the byte at address `base + x`; both are
  // page-aligned together, so a page of the source is a page of the file.
  const uintptr_t base = address - copy.offset;
  const size_t shared_from = (copy.offset + page - 1) / page * page;
  const size_t shared_to = *segment_bytes / page * page;
  for (size_t from = copy.offset; from < *segment_bytes;) {
    const size_t to = std::min(*segment_bytes, (from / kChunkBytes + 1) * kChunkBytes);
    segment.reserve(from, to - from);
    const size_t map_from = std::max(from, shared_from);
    const size_t map_to = std::min(to, shared_to);
    // Another thread's write to these pages waits from before their copy
    // until they are mapped from it (held_writes.h): none is lost.
    std::optional<detail::HeldWrites> hold;
    if (share && map_from < map_to) {
      hold.emplace(base + map_from, map_to - map_from);
      share = hold->held();
    }
    segment.write(from, reinterpret_cast<const void*>(base + from), to - from);
    if (share && map_from < map_to) {
      void* mapped = ::mmap(reinterpret_cast<void*>(base + map_from), map_to - map_from,
                            PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, segment.fd(),
                            static_cast<off_t>(segment.file_offset() + map_from));
      if (mapped == MAP_FAILED) {
        share = false;  // the rest keeps its own pages
        hold->restore_write_access();
        restore_if_unmapped(base + map_from, map_to - map_from, segment.data() + map_from);
      } else {
        map_page_tables(base + map_from, map_to - map_from);
        copy.shared_bytes += map_to - map_from;
      }
    }
    from = to;
  }
  return copy;
}

}  // namespace leanloader
