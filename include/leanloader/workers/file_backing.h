// FileBacking: whether a range of this process's memory is a file's bytes,
// so that another process can map the file instead of receiving a copy.
//
// Why: a dataset often holds np.memmap slices (a train split of a token
// file), tensors from torch.load(mmap=True) or safetensors: memory the page
// cache already holds. A worker should map the same file range (zero bytes
// copied, pages shared through the page cache, as fork shares them), not get
// a copy in shared memory. One rule serves the DataLoader's pickler and
// ll.audit, so that what audit reports is what sharing does.
//
// The rule: [address, address + bytes) lies in mappings of one regular file
// (same device and inode, file offsets continuing from mapping to mapping,
// the file not deleted) and every page of it still holds the file's bytes:
// the mapping is shared (MAP_SHARED: writes reach the file), read-only, or
// private but not written (no page of the range is anonymous in
// /proc/self/pagemap, present or swapped). Thread-safety: reads /proc; a
// page written after the call is not seen (callers hold the GIL, as for
// any pickling of a live object).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace leanloader {

struct FileBacking {
  std::string path;     // as /proc/self/maps names it (absolute)
  uint64_t offset = 0;  // file offset of `address`
  uint64_t device = 0;  // st_dev and st_ino of the file mapped
  uint64_t inode = 0;
  bool shared = false;  // MAP_SHARED and writable: writes reach the file
};

// The file range behind [address, address + bytes), or nullopt when the rule
// above does not hold (anonymous memory, a deleted or special file, a range
// across different files, private pages written since they were mapped).
std::optional<FileBacking> file_backing(const void* address, size_t bytes);

}  // namespace leanloader
