#include "workers/written_pages.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "core/page_size.h"
#include "io/file_io.h"
#include "io/pagemap.h"
#include "io/proc_maps.h"

namespace leanloader::detail {

namespace {

// The file range [start, end) is mapped from: one file (device, inode), file
// offsets continuing from mapping to mapping, every mapping shared ('s') or
// private ('p') as asked. `offset` is the file offset of `start`.
struct MappedFileRange {
  uint64_t device = 0;
  uint64_t inode = 0;
  uint64_t offset = 0;
};

std::optional<MappedFileRange> mapped_file_range(const std::vector<ProcessMapping>& mappings,
                                                 uintptr_t start, uintptr_t end, char kind) {
  std::optional<MappedFileRange> found;
  uintptr_t covered = start;
  uint64_t next_offset = 0;
  for (const ProcessMapping& mapping : mappings) {
    if (mapping.end <= covered) continue;
    if (mapping.start > covered || mapping.inode == 0 || mapping.perms.size() != 4 ||
        mapping.perms[3] != kind) {
      return std::nullopt;  // a gap, anonymous memory, or the other kind of mapping
    }
    const uint64_t offset = mapping.offset + (covered - mapping.start);
    if (!found) {
      found = MappedFileRange{mapping.device, mapping.inode, offset};
    } else if (mapping.device != found->device || mapping.inode != found->inode ||
               offset != next_offset) {
      return std::nullopt;
    }
    next_offset = offset + (std::min(mapping.end, end) - covered);
    covered = mapping.end;
    if (covered >= end) return found;
  }
  return std::nullopt;
}

}  // namespace

bool for_each_written_page(uintptr_t start, uintptr_t end,
                           const std::function<bool(uintptr_t)>& visit) {
  const std::unique_ptr<File> pagemap = open_pagemap("/proc/self/pagemap");
  if (pagemap == nullptr) return false;
  std::vector<uint64_t> entries;
  return for_each_pagemap_entry(
      pagemap->fd(), start, end, page_size(), entries, [&](uintptr_t at, uint64_t entry) {
        const bool written =
            (entry & (kPagePresent | kPageSwapped)) != 0 && (entry & kPageFileOrShared) == 0;
        return !written || visit(at);
      });
}

std::optional<bool> equal_where_written(const void* source, const void* copy, size_t bytes) {
  const size_t page = page_size();
  const auto from = reinterpret_cast<uintptr_t>(source);
  const auto to = reinterpret_cast<uintptr_t>(copy);
  if (bytes == 0 || from + bytes < from || to + bytes < to || from % page != to % page) {
    return std::nullopt;
  }
  const uintptr_t first = (from + page - 1) / page * page;  // the page-aligned interior
  const uintptr_t last = (from + bytes) / page * page;
  if (last <= first) return std::nullopt;
  const uintptr_t copy_first = to + (first - from);
  const std::vector<ProcessMapping> mappings = read_process_mappings();
  const auto source_file = mapped_file_range(mappings, first, last, 'p');
  const auto copy_file = mapped_file_range(mappings, copy_first, copy_first + (last - first), 's');
  if (!source_file || !copy_file || source_file->device != copy_file->device ||
      source_file->inode != copy_file->inode || source_file->offset != copy_file->offset) {
    return std::nullopt;
  }
  bool equal = true;
  const bool read = for_each_written_page(first, last, [&](uintptr_t address) {
    equal = std::memcmp(reinterpret_cast<const void*>(address),
                        reinterpret_cast<const void*>(to + (address - from)), page) == 0;
    return equal;
  });
  if (!equal) return false;
  if (!read) return std::nullopt;
  // The partial pages at either end are the source's own memory.
  return std::memcmp(source, copy, first - from) == 0 &&
         std::memcmp(reinterpret_cast<const void*>(last),
                     reinterpret_cast<const void*>(to + (last - from)), from + bytes - last) == 0;
}

}  // namespace leanloader::detail
