// SharedArena: many shared memory segments in one file, so that sharing many
// arrays costs one descriptor instead of one each.
//
// Why: ll.DataLoader gives workers one shared copy of each large array of a
// dataset. A file (memfd) per copy costs a descriptor per array in the main
// process and in every worker: 1,500 pre-decoded images fail with "Too many
// open files" under the usual limit of 1,024. An arena is one unnamed file
// (a memfd, or an O_TMPFILE inode in a directory the user names, as
// SharedSegment::create makes them); each segment allocated from it is a
// page-aligned range of that file, mapped on its own, and workers attach the
// ranges they need through the one descriptor (SharedSegment::attach with a
// file offset).
//
// Freeing: when a range's last segment goes, its pages go back to the system
// (fallocate PUNCH_HOLE), unless some mapping may still read them, where the
// punched pages would read as zeros instead of the copy's bytes:
//   - a range whose pages this process maps privately over memory of its own
//     (shared_copy's page sharing) is punched once /proc/self/maps shows no
//     mapping of it (checked again at each later allocate() and release);
//   - a range that existed when this process forked is never punched: the
//     child may map it (an inherited mapping, or the dataset's page-shared
//     arrays); its pages go with the file, when the arena and every mapping
//     of it are gone. Workers made by the fork server or spawn inherit
//     nothing; they map the ranges they were sent, and their owner keeps the
//     segments they attach until they are gone.
// Ranges are never reused (the file is sparse: a hole costs nothing), so no
// worker can read another array at a freed range's offset.
//
// Ownership: each segment keeps its arena alive; the file's descriptor lives
// while the arena or one of its segments does. Thread-safety: allocate() and
// the release of segments may run on any threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "leanloader/workers/shared_segment.h"

namespace leanloader {

class SharedArena final : public std::enable_shared_from_this<SharedArena> {
 public:
  // An arena whose file is created in `dir` (default_shm_dir() when empty;
  // a memfd when that is empty too). Throws IoError.
  static std::shared_ptr<SharedArena> create(const std::string& dir = "");

  // A new segment of `size` (> 0) bytes at a page-aligned offset of the
  // file, mapped read-write, its pages reserved now (kNow: a full directory
  // is an ENOSPC here, with its free space) or by the caller through
  // SharedSegment::reserve before it writes them (kLater). Throws as
  // SharedSegment::create does.
  std::shared_ptr<SharedSegment> allocate(
      size_t size, SharedSegment::Reserve reserve = SharedSegment::Reserve::kNow);

  int fd() const noexcept { return file_->fd; }
  const std::string& path() const noexcept { return file_->path; }
  // The file's length: the end of the last range allocated.
  size_t file_bytes() const;
  // Ranges released whose pages are still held (see "Freeing" above).
  size_t held_back_ranges() const;

 private:
  friend class SharedSegment;

  explicit SharedArena(std::shared_ptr<const SharedFile> file);
  // Called by a segment's destructor, after it unmapped the range.
  void release(size_t file_offset, size_t length, uint64_t forks_at_creation,
               bool mapped_privately) noexcept;
  // Punches the held-back ranges no mapping of this process reads any more.
  // Caller holds mutex_.
  void punch_unmapped_locked() noexcept;
  void punch_locked(size_t file_offset, size_t length) noexcept;

  struct HeldRange {
    size_t offset;
    size_t length;
    uint64_t forks_at_creation;
  };

  const std::shared_ptr<const SharedFile> file_;
  uint64_t device_ = 0;
  uint64_t inode_ = 0;
  mutable std::mutex mutex_;
  size_t end_ = 0;               // guarded by mutex_
  std::vector<HeldRange> held_;  // guarded by mutex_: mapped privately when released
  size_t never_punched_ = 0;     // guarded by mutex_: released ranges a fork may map
};

// How many times this process has forked since it started (counted by a
// pthread_atfork handler installed with the first arena).
uint64_t forks_of_this_process() noexcept;

// Takes back the count of the fork this thread just made, for a child that
// reads no range an arena of this process releases from then on: the fork
// server forked from the main process, whose workers map what they read by
// reference. The ranges its mappings share can then still be punched when
// released (else every range released later would stay held while it lives).
void forget_fork_of_a_child_that_reads_no_released_range() noexcept;

}  // namespace leanloader
