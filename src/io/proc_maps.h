// Lines of /proc/PID/maps (and the mapping header lines of smaps): one parser
// for the memory monitor, which reads other processes' maps often and must
// not allocate per line, and for the shared-copy rules, which read this
// process's maps.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace leanloader::detail {

// "start-end perms offset major:minor inode [path]". The views point into
// the parsed line.
struct MapsLine {
  uintptr_t start = 0;
  uintptr_t end = 0;
  std::string_view perms;  // "rw-p", "r--s", ...
  uint64_t offset = 0;
  uint64_t major = 0;
  uint64_t minor = 0;
  uint64_t inode = 0;
  std::string_view path;  // "" for anonymous memory; "... (deleted)" for unlinked files
};

// The mapping a maps line describes, or nullopt for any other line (smaps'
// "Rss:  4 kB", "VmFlags: rd wr", ...).
std::optional<MapsLine> parse_maps_line(std::string_view line);

// A mapping of this process, owning its strings.
struct ProcessMapping {
  uintptr_t start = 0;
  uintptr_t end = 0;
  std::string perms;
  uint64_t offset = 0;
  uint64_t device = 0;  // as st_dev (makedev of major:minor)
  uint64_t inode = 0;
  std::string path;
};

// The mappings of /proc/self/maps in address order (empty if unreadable).
std::vector<ProcessMapping> read_process_mappings();

}  // namespace leanloader::detail
