// This process's memory mappings, as /proc/self/maps lists them: what the
// shared-copy rules check and how a shared file mapping is found again.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace leanloader::detail {

struct ProcessMapping {
  uintptr_t start = 0;
  uintptr_t end = 0;
  std::string perms;  // "rw-p", "r--s", ...
  uint64_t offset = 0;
  uint64_t device = 0;  // as st_dev (makedev of the listed major:minor)
  uint64_t inode = 0;
  std::string path;  // "" for anonymous memory; "... (deleted)" for unlinked files
};

// The mappings in address order. Lines that do not parse are skipped.
std::vector<ProcessMapping> read_process_mappings();

}  // namespace leanloader::detail
