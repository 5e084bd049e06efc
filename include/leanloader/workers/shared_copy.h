// SharedCopy: one copy of a block of this process's memory in a SharedSegment
// for worker processes to map, that costs no second copy in this process
// where the block's pages can be shared.
//
// Why: ll.DataLoader leaves the user's dataset as it was, so a large array
// that workers map exists twice: the user's, and the shared copy. Where the
// block is a whole allocation of glibc's malloc that malloc took from mmap (a
// "mmapped chunk": every allocation above malloc's mmap threshold, at most
// 32 MiB, as NumPy's and torch's large arrays are), its page-aligned interior
// is then mapped from the copy, MAP_PRIVATE | MAP_FIXED over the same
// addresses: the same bytes at the same addresses, the block's anonymous pages
// go back to the kernel, and this process's later writes land in private
// copies of the pages written, which workers do not see (what a copy
// promises, paid for the pages written only). The copy is made and mapped in
// chunks, so the block and its copy never coexist whole.
//
// Why only glibc's mmapped chunks: the remapped pages are file pages. An
// allocator that keeps freed memory, releases it with madvise(MADV_DONTNEED)
// and hands it out again as zeroed memory would hand out the file's bytes
// instead (jemalloc, tcmalloc, glibc's own non-main heaps). glibc frees a
// mmapped chunk with munmap, which removes the file mapping with the rest,
// and reallocates it with mremap, which refuses a range of several mappings
// (glibc then copies). So the pages are shared only when:
//   - this process's malloc, free and realloc are glibc's (no preloaded
//     allocator, no sanitizer runtime);
//   - the chunk header before `source` describes a mmapped chunk that holds
//     the whole block, page-aligned at both ends;
//   - /proc/self/maps shows that chunk as private read-write memory:
//     anonymous, or the file of an earlier shared copy by this process, and
//     the process uses less than half of vm.max_map_count;
//   - the segment is on tmpfs (elsewhere the pages would be paged from
//     disk) with room for the whole copy (the pages stay in that directory
//     for the block's lifetime: a directory that fills up mid-way must not
//     keep some of them).
// Anything else gets a plain copy (shared_bytes == 0), never an error.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "leanloader/workers/shared_arena.h"
#include "leanloader/workers/shared_segment.h"

namespace leanloader {

struct SharedCopy {
  std::shared_ptr<SharedSegment> segment;
  // Where the copy starts in the segment: source's offset in its page, so that
  // the segment's pages line up with the source's.
  size_t offset = 0;
  // Bytes of the source that are now mapped from the segment (0: a plain copy).
  size_t shared_bytes = 0;
};

enum class PageSharing {
  kOff,        // a plain copy
  kWhereSafe,  // share the source's pages when the rules above allow it
};

// Copies `bytes` (> 0) bytes at `source` into a new segment of `arena` and, with kWhereSafe, maps
// the source's pages from it where the rules above allow. Contract: with kWhereSafe, `source` must
// be the pointer the allocator returned for the block (NumPy: an array that owns its data; torch: a
// resizable storage's data pointer). Other threads may write the block meanwhile: each chunk is
// read-only from before its copy until it is mapped from the copy, and a write to it waits for
// that (src/workers/held_writes.h), so that no write is lost.
// Throws IoError (ENOSPC names the directory and its free space); the source keeps its bytes
// whatever happens.
SharedCopy make_shared_copy(void* source, size_t bytes, SharedArena& arena, PageSharing sharing);

// The same in an arena of its own, in `dir` (default_shm_dir() when empty).
SharedCopy make_shared_copy(void* source, size_t bytes, const std::string& dir,
                            PageSharing sharing);

// Whether the `bytes` bytes at `source` still equal those at `copy`: a
// shared copy made in an earlier pass stays the workers' only while the
// main process has not written the source since (torch's workers, fork or
// spawn, see what the main process holds when they start). Bytes, not
// values: -0.0 is not 0.0, a NaN equals its own bit pattern. Where the
// source's pages are still mapped from this copy, only the pages written
// since are compared (src/workers/written_pages.h); `pages_shared` false
// (the copy was made without sharing pages: SharedCopy::shared_bytes 0)
// skips finding that out (a read of /proc/self/maps) and compares all.
bool copy_is_current(const void* source, const void* copy, size_t bytes, bool pages_shared = true);

// Why the pages of `bytes` bytes at `source` cannot be shared (one of the
// rules above), or "" when they can. Reads /proc/self/maps.
std::string page_sharing_refusal(const void* source, size_t bytes);

// The same for each of `blocks` (address, bytes), reading /proc/self/maps
// once: the reasons in the same order.
std::vector<std::string> page_sharing_refusals(
    const std::vector<std::pair<const void*, size_t>>& blocks);

}  // namespace leanloader
