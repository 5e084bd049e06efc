#include "leanloader/workers/file_backing.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>

#include "io/proc_maps.h"
#include "workers/written_pages.h"

namespace leanloader {

namespace {

constexpr std::string_view kDeleted = " (deleted)";

// True when a page of [start, end) in this process is anonymous: a private
// copy written since the file was mapped. Unreadable pagemap: true (no claim
// is made without proof).
bool has_private_pages(uintptr_t start, uintptr_t end) {
  bool found = false;
  const bool read = detail::for_each_written_page(start, end, [&](uintptr_t) {
    found = true;
    return false;
  });
  return found || !read;
}

}  // namespace

std::optional<FileBacking> file_backing(const void* address, size_t bytes) {
  if (bytes == 0) return std::nullopt;
  const auto start = reinterpret_cast<uintptr_t>(address);
  if (start + bytes < start) return std::nullopt;
  const uintptr_t end = start + bytes;
  std::optional<FileBacking> found;
  uintptr_t covered = start;
  uint64_t next_offset = 0;
  bool private_writable = false;
  char kind = 0;  // 's' or 'p', the same for every mapping of the range
  for (const detail::ProcessMapping& mapping : detail::read_process_mappings()) {
    if (mapping.end <= covered) continue;
    if (mapping.start > covered) return std::nullopt;  // a gap
    const std::string& path = mapping.path;
    if (mapping.inode == 0 || path.empty() || path[0] != '/' || mapping.perms.size() != 4 ||
        (path.size() > kDeleted.size() &&
         path.compare(path.size() - kDeleted.size(), kDeleted.size(), kDeleted) == 0)) {
      return std::nullopt;
    }
    const uint64_t offset = mapping.offset + (covered - mapping.start);
    if (!found) {
      found = FileBacking{path, offset, mapping.device, mapping.inode,
                          mapping.perms[3] == 's' && mapping.perms[1] == 'w'};
      kind = mapping.perms[3];
    } else if (mapping.device != found->device || mapping.inode != found->inode ||
               offset != next_offset || mapping.perms[3] != kind ||
               (kind == 's' && (mapping.perms[1] == 'w') != found->shared)) {
      return std::nullopt;
    }
    private_writable = private_writable || (mapping.perms[3] == 'p' && mapping.perms[1] == 'w');
    next_offset = offset + (std::min(mapping.end, end) - covered);
    covered = mapping.end;
    if (covered >= end) break;
  }
  if (!found || covered < end) return std::nullopt;
  // The name must still be that file (not replaced by a rename since).
  struct stat st {};
  if (::stat(found->path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) ||
      static_cast<uint64_t>(st.st_ino) != found->inode ||
      static_cast<uint64_t>(st.st_dev) != found->device) {
    return std::nullopt;
  }
  if (private_writable && has_private_pages(start, end)) return std::nullopt;
  return found;
}

}  // namespace leanloader
