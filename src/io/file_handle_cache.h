// Files opened on demand within a descriptor budget. Internal.
//
// A source over thousands of files (HDF5 shards) cannot hold a descriptor for
// each under the usual 1,024 limit: files are registered once (their identity
// taken then) and opened when read, the least recently used closed beyond the
// budget. A file reopened later must be the one registered (same device,
// inode, size and modification time), else reading it is an error: a file
// replaced under a running loader never serves another file's bytes.
//
// Thread-safe. A File handed out stays open while its holder keeps it, so the
// count may pass the budget by the number of readers at that moment.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "io/file_io.h"

namespace leanloader::detail {

class FileHandleCache {
 public:
  // `budget` 0 picks a quarter of the soft RLIMIT_NOFILE, within [16, 512].
  explicit FileHandleCache(size_t budget = 0);
  FileHandleCache(const FileHandleCache&) = delete;
  FileHandleCache& operator=(const FileHandleCache&) = delete;

  // Registers `path` (opened and stat'ed now, then kept within the budget);
  // returns its key. Throws IoError.
  size_t add(const std::string& path);
  // The open file for `key`, opened again if it was closed.
  std::shared_ptr<const File> get(size_t key);
  const std::string& path(size_t key) const { return entries_.at(key).path; }
  // Throws FormatError when the file registered as `key` is no longer what
  // it was then (replaced, or written: size or modification time), open or
  // not; IoError when it cannot be stat'ed.
  void check_unchanged(size_t key) const;
  // Whether it still is (false when it cannot be stat'ed).
  bool unchanged(size_t key) const;

  size_t budget() const noexcept { return budget_; }
  size_t open_count() const;

 private:
  struct Entry {
    std::string path;
    FileIdentity identity;
    std::shared_ptr<const File> file;  // null while closed
    std::list<size_t>::iterator position;
  };
  std::shared_ptr<const File> open_locked(Entry& entry, size_t key);
  // The path and identity registered as `key`.
  std::pair<std::string, FileIdentity> registered(size_t key) const;
  void touch_locked(Entry& entry, size_t key);

  size_t budget_;
  mutable std::mutex mutex_;
  std::deque<Entry> entries_;  // stable references: add() appends while readers hold entries
  std::list<size_t> open_;     // keys of open files, most recently used first
};

}  // namespace leanloader::detail
