#include "leanloader/workers/file_backing.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/page_size.h"
#include "io/proc_maps.h"

namespace leanloader {

namespace {

constexpr std::string_view kDeleted = " (deleted)";

using detail::page_size;

// True when a page of [start, end) in this process is anonymous: present or
// swapped without being a file page (pagemap bits 63, 62 and 61), that is,
// a private copy written since the file was mapped. Unreadable pagemap:
// true (no claim is made without proof).
bool has_private_pages(uintptr_t start, uintptr_t end) {
  const int fd = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return true;
  const size_t page = page_size();
  constexpr uint64_t kPresent = uint64_t{1} << 63;
  constexpr uint64_t kSwapped = uint64_t{1} << 62;
  constexpr uint64_t kFilePage = uint64_t{1} << 61;
  std::vector<uint64_t> entries(4096);
  bool found = false;
  for (uintptr_t at = start / page * page; at < end && !found;) {
    const size_t pages = std::min<size_t>(entries.size(), (end - at + page - 1) / page);
    const ssize_t got = ::pread(fd, entries.data(), pages * sizeof(uint64_t),
                                static_cast<off_t>(at / page * sizeof(uint64_t)));
    if (got != static_cast<ssize_t>(pages * sizeof(uint64_t))) {
      found = true;
      break;
    }
    for (size_t i = 0; i < pages && !found; ++i) {
      const uint64_t entry = entries[i];
      found = (entry & (kPresent | kSwapped)) != 0 && (entry & kFilePage) == 0;
    }
    at += pages * page;
  }
  ::close(fd);
  return found;
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
