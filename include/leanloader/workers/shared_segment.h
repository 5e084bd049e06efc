// SharedSegment: a block of shared memory (a memfd, or an unnamed file of a
// tmpfs the user names) that several processes map, reserved in full up
// front and never reachable by a name.
//
// Why: worker processes must share one copy of large arrays and write batches
// where the main process can read them without a copy. Two failure modes of
// the usual approach (torch's) are designed out here:
//   - A full /dev/shm: Docker's and Kubernetes' default /dev/shm holds
//     64 MiB, and a sparse tmpfs file maps fine, then the first write into a
//     missing page raises SIGBUS mid-epoch. By default a segment is a memfd
//     (limited by memory, charged to the memory cgroup, not by /dev/shm's
//     size); in a directory the user names, create() reserves every page
//     with posix_fallocate, so a full tmpfs is an OSError(ENOSPC) at
//     creation, naming the directory, the size requested and the free space.
//   - Leftovers after SIGKILL: a memfd or an O_TMPFILE inode never has a
//     name, so nothing is left anywhere whatever happens to the process (a
//     filesystem without O_TMPFILE gets a name unlinked right after open).
//     The memory lives as long as some process holds the descriptor or a
//     mapping. Other processes attach through /proc/<owner pid>/fd/<fd> (see
//     attach()), which works for unnamed files while the owner lives.
//
// A segment maps a whole file, or one range of a SharedArena's file (many
// arrays, one descriptor: see shared_arena.h); attach() may map one range.
//
// Ownership: a SharedSegment owns its mapping and shares its file's
// descriptor (SharedFile) with the other segments of the same file in this
// process; the mapping is released when the last shared_ptr goes away, the
// descriptor with the last segment of the file. It is a Storage, so Tensors
// can view it and keep it alive. Thread-safety: immutable after construction;
// the bytes are plain shared memory (callers coordinate writers).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "leanloader/core/storage.h"

namespace leanloader {

// The directory segments are created in: $LEANLOADER_SHM_DIR when set and
// not empty, else "" (anonymous shared memory: memfds).
std::string default_shm_dir();

// A descriptor of this process for the file mapped shared (MAP_SHARED, from
// the file's first byte) at `address`, the file holding at least `bytes`
// bytes, or -1: how another process attaches shared memory made by other
// means (torch's share_memory_() keeps such a descriptor) through
// "/proc/<pid>/fd/<fd>". Reads /proc/self/maps and /proc/self/fd.
int shared_mapping_descriptor(const void* address, size_t bytes);

class SharedArena;

// A descriptor of a shared memory file and what names it in messages; closed
// when the last segment that maps part of the file goes.
struct SharedFile {
  SharedFile(int fd_arg, std::string path_arg) : fd(fd_arg), path(std::move(path_arg)) {}
  ~SharedFile();
  SharedFile(const SharedFile&) = delete;
  SharedFile& operator=(const SharedFile&) = delete;

  const int fd;
  const std::string path;
};

// enable_shared_from_this: a segment handed to C++ from Python (a slot pool
// adopting a worker's batch segment) is then held by its own shared_ptr, not by
// one that keeps the Python wrapper alive; a batch tensor outliving the
// extension module at interpreter exit (a view kept by torch) then holds no
// Python object of ours, which nanobind would report as leaked.
class SharedSegment final : public Storage, public std::enable_shared_from_this<SharedSegment> {
 public:
  enum class Reserve {
    kNow,    // every page at creation
    kLater,  // by the caller, through reserve(), before it writes a range
  };

  // Creates a segment of `size` bytes in `dir` (default_shm_dir() when
  // empty; a memfd when that is empty too), reserves it with posix_fallocate
  // (kNow) and maps it read-write. Throws IoError (ENOSPC with the free space
  // in the message when the directory is full, ENOMEM for a memfd) or
  // InvalidArgument for size 0.
  static std::shared_ptr<SharedSegment> create(size_t size, const std::string& dir = "",
                                               Reserve reserve = Reserve::kNow);

  // Maps an existing segment through `path`, usually "/proc/<pid>/fd/<fd>"
  // of the process that created it: `size` bytes from `file_offset` (a
  // multiple of the page size), or with size 0 the whole file. Segments
  // attached from one file share one descriptor (a worker attaching a
  // thousand arrays of one arena holds one). The range is mapped:
  //   writable, !copy_on_write: shared read-write (writes reach every process)
  //   !writable:                read-only
  //   copy_on_write:            pages are shared until this process writes
  //                             one; the write lands in a private copy (the
  //                             semantics of a pickled copy at the cost of
  //                             the pages actually written).
  // Throws IoError.
  static std::shared_ptr<SharedSegment> attach(const std::string& path, bool writable = true,
                                               bool copy_on_write = false, size_t file_offset = 0,
                                               size_t size = 0);

  ~SharedSegment() override;

  // The descriptor that keeps the memory alive in this process.
  int fd() const noexcept { return file_->fd; }
  // Where the segment starts in its file (0 unless it is a range of an
  // arena's file).
  size_t file_offset() const noexcept { return file_offset_; }
  // What names it in messages: "memfd:leanloader-<pid>-<n>-<salt>", the
  // directory and unique name it was made in (never linked there), or the
  // attach path.
  const std::string& path() const noexcept { return file_->path; }
  bool writable() const noexcept { return writable_; }
  bool copy_on_write() const noexcept { return copy_on_write_; }

  // The path another process on this host opens to attach this segment:
  // "/proc/<this pid>/fd/<fd>".
  std::string attach_path() const;

  // Reserves the pages of [offset, offset + bytes) with posix_fallocate, so
  // that writing them cannot raise SIGBUS. Throws as create() does, and
  // InvalidArgument when the range does not fit.
  void reserve(size_t offset, size_t bytes);

  // Copies `bytes` bytes from `src` to `offset`. A segment this process made
  // (create(), SharedArena::allocate()) is written through its file
  // (pwrite): a page never written before is then filled without being
  // zeroed first and without a page fault per 4 KiB page in this process
  // (a 300 MB batch into a fresh memfd on the 2-core AMD VM: ~100 ms, against
  // ~230 ms through the mapping's faults). A segment attached from another
  // process (a batch slot offered again, whose pages were written before) is
  // written through the mapping, faster for pages already there (~55 ms for
  // the same 300 MB). Either way every mapping of the file sees the bytes.
  // Throws InvalidArgument when the range does not fit, or when the segment
  // is read-only; IoError when the file has no room for pages not reserved.
  void write(size_t offset, const void* src, size_t bytes);

  // The segment that contains `address` among the segments alive in this
  // process (created or attached), or nullptr. Lets a pickler recognise an
  // array that already lives in shared memory. Thread-safe.
  static std::shared_ptr<SharedSegment> find(const void* address);

  // Records that this process maps pages of `segment`'s file privately over
  // memory of its own (shared_copy's page sharing), so that
  // mapped_privately_here() knows the file. Thread-safe.
  static void remember_mapped_privately(SharedSegment& segment);

  // Whether the file (st_dev, st_ino) is a segment remembered above, alive
  // or not: a mapping of it may be replaced again (see shared_copy).
  // Thread-safe.
  static bool mapped_privately_here(uint64_t device, uint64_t inode);

 private:
  friend class SharedArena;

  SharedSegment(std::byte* data, size_t size, std::shared_ptr<const SharedFile> file,
                size_t file_offset, bool writable, bool copy_on_write);
  static void register_segment(const std::shared_ptr<SharedSegment>& segment);
  // A segment over `size` bytes at `data`, the shared mapping of `file` from
  // `file_offset`, given back to `arena` when it goes (SharedArena::allocate).
  static std::shared_ptr<SharedSegment> over_range(std::byte* data, size_t size,
                                                   std::shared_ptr<const SharedFile> file,
                                                   size_t file_offset,
                                                   std::shared_ptr<SharedArena> arena);

  void check_range(size_t offset, size_t bytes, const char* what) const;

  std::shared_ptr<const SharedFile> file_;
  size_t file_offset_;
  bool writable_;
  bool copy_on_write_;
  // Made by this process (create(), over_range()): write() goes through the
  // file. Fixed at construction.
  bool made_here_ = false;
  // The arena whose range this is (given back when the segment goes), or null.
  std::shared_ptr<SharedArena> arena_;
  // Which fork of this process came last when the range was made (see
  // SharedArena: a range a forked child may map is never punched).
  uint64_t forks_at_creation_ = 0;
  // Whether this process mapped pages of the range privately over memory of
  // its own (shared_copy's page sharing): the range is punched only once no
  // such mapping is left.
  bool mapped_privately_ = false;
};

}  // namespace leanloader
