// Reading a cold file in the windows a memory-mapped reader's page faults
// would read. Internal.
//
// A page fault in a mapped file reads the device's read-ahead around the
// faulting page (`read_ahead_kb`: 128 KiB by default, 8 MiB on some virtual
// disks). Readers that copy rows out of a mapping (NumPy's memmap, Grain,
// torchdata) therefore read a cold file in large requests, and once they have
// touched every window the file is in memory. A pread of the exact row, even
// announced ahead (POSIX_FADV_WILLNEED), reads only the row: on a device with
// a large read-ahead that is many small random reads instead of a few large
// ones. ReadAround announces, after the rows themselves, the aligned window
// of the device's read-ahead holding each upcoming row, once per window (a
// second later again), and only where that is what a mapped reader would do anyway and the file's
// rows fit in memory (a file larger than memory would read windows it evicts before their rows are
// read).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "io/file_io.h"

namespace leanloader::detail {

// The read-ahead of the block device holding the open file `fd`, in bytes
// (sysfs `queue/read_ahead_kb` of the device or of the disk a partition is
// on); 0 when it cannot be told (tmpfs, network and FUSE file systems).
size_t device_read_ahead_bytes(int fd) noexcept;

class ReadAround {
 public:
  // Windows of `window_bytes` over the file's bytes [begin, end); a window
  // is read again when announced `reannounce_after` or more after its last
  // announcement (its pages may have been evicted since: a later pass over a
  // file dropped from the page cache). Use for_rows() to decide whether
  // reading around pays.
  ReadAround(std::shared_ptr<const File> file, size_t begin, size_t end, size_t window_bytes,
             std::chrono::milliseconds reannounce_after = std::chrono::seconds(1));

  // Null unless the device reads ahead more than `row_bytes` around a fault
  // and [begin, end) is at most half of `available_memory` bytes.
  static std::unique_ptr<ReadAround> for_rows(std::shared_ptr<const File> file, size_t begin,
                                              size_t end, size_t row_bytes,
                                              uint64_t available_memory);

  size_t window_bytes() const noexcept { return window_; }

  // Starts reading the window holding `offset` (POSIX_FADV_WILLNEED) unless
  // it was announced less than `reannounce_after` ago (cheap then; an
  // announcement of a window already in memory would still walk its pages).
  // Returns the bytes announced: the window's, or 0.
  size_t announce(size_t offset) const noexcept;

 private:
  uint32_t now_ms() const noexcept;

  std::shared_ptr<const File> file_;
  size_t begin_;
  size_t end_;
  size_t window_;
  size_t windows_;
  uint32_t reannounce_ms_;
  std::chrono::steady_clock::time_point created_;
  // Per window: when it was last announced, in ms since created_ plus one
  // (0: never).
  std::unique_ptr<std::atomic<uint32_t>[]> announced_at_;
};

}  // namespace leanloader::detail
