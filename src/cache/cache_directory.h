// The files of a TensorCache directory: atomic publishing, the directory
// lock, and clean-up after a crashed writer. Internal.
//
// Locking protocol (flock on "<dir>/.lock", released by the kernel when the
// process dies, so a SIGKILLed writer never leaves it held):
// - every reader (TensorCache) and every writer (CacheWriter) holds a shared
//   lock for its lifetime;
// - clean-up (removing stray temp files and shards no manifest references)
//   runs only under an exclusive lock taken without waiting, i.e. when no
//   other reader or writer has the cache open. So a shard is never deleted
//   while someone may still map it lazily, and a writer's freshly published
//   shard is never mistaken for an orphan before its manifest lands.
//
// Which orphans clean-up may delete: only shards the cache itself vouched
// for. A writer creates "<shard>.discardable" before renaming a new shard
// into place (and removes it once a manifest references the shard), and
// before publishing a manifest that drops a superseded shard. A shard that no
// manifest references and that has no such marker was not left by a writer
// here: typically a copy of the cache whose manifest has not arrived yet.
// It is kept and reported by verify ("unreferenced"); deleting it as garbage
// lost every shard of a copy opened before its manifest was copied.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "io/file_io.h"

namespace leanloader::detail {

// "<dir>/<name>"
std::string join_path(const std::string& directory, const std::string& name);

// Names (not paths) of the regular files in `directory`, sorted. Throws
// IoError.
std::vector<std::string> list_files(const std::string& directory);

bool ends_with(std::string_view text, std::string_view suffix) noexcept;
bool starts_with(std::string_view text, std::string_view prefix) noexcept;

// Names the cache itself writes: shards ("shard-*.safetensors"), manifests
// ("manifest.json", "manifest.rank<r>.json") and their temp files
// ("<name>.tmp.<pid>.<random>").
bool is_shard_name(std::string_view name) noexcept;
bool is_rank_manifest_name(std::string_view name) noexcept;
bool is_cache_temp_name(std::string_view name) noexcept;

// "<shard>.discardable": the marker above.
std::string discardable_marker_name(const std::string& shard_name);
bool is_discardable_marker_name(std::string_view name) noexcept;
// Creates the markers of `shard_names` (durably: the directory is synced)
// before the caller publishes a shard or a manifest without them. Throws
// IoError.
void mark_discardable(const std::string& directory, const std::vector<std::string>& shard_names);
// Removes the marker of a shard a published manifest now references. Best
// effort: a stale marker of a referenced shard is removed by clean-up.
void unmark_discardable(const std::string& directory, const std::string& shard_name) noexcept;

// Writes `bytes` to `path` atomically (AtomicFileWriter: temp + fsync +
// rename + directory fsync). Throws IoError after removing the temp file.
void write_file_atomically(const std::string& path, std::string_view bytes);

// Reads a whole (small) file. Throws IoError.
std::string read_text_file(const std::string& path);

// Holds flock on "<directory>/.lock" (see the protocol above). Moveable, not
// copyable; the lock is released on destruction.
class CacheLock {
 public:
  CacheLock() = default;
  // Takes a shared lock, after an opportunistic exclusive one for clean-up
  // when `cleanup` is set; `removed` (optional) receives the names cleaned.
  // Throws IoError when "<directory>/.lock" cannot be opened for writing
  // (created if missing), except on a read-only file system, where no
  // process can delete anything: there it runs unlocked and without clean-up.
  static CacheLock open_shared(const std::string& directory, bool cleanup,
                               std::vector<std::string>* removed);
  ~CacheLock();
  CacheLock(CacheLock&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  CacheLock& operator=(CacheLock&& other) noexcept;
  CacheLock(const CacheLock&) = delete;
  CacheLock& operator=(const CacheLock&) = delete;

 private:
  explicit CacheLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

// Held while a writer reads manifest.json, merges what it has just published
// into it and writes it back, so that writers publish one at a time (other
// processes, or other writers in this one): none overwrites the entries
// another published after it read the manifest. flock(LOCK_EX) on
// "<directory>/.manifest.lock"; readers never take it. On a read-only file
// system it locks nothing (nothing can be written there).
class ManifestWriteLock {
 public:
  explicit ManifestWriteLock(const std::string& directory);
  ~ManifestWriteLock();
  ManifestWriteLock(const ManifestWriteLock&) = delete;
  ManifestWriteLock& operator=(const ManifestWriteLock&) = delete;

 private:
  int fd_ = -1;
};

// Removes stray temp files and the marked shards (see above) referenced by
// neither manifest.json nor any manifest.rank<r>.json, and markers no longer
// needed. Call only under the exclusive lock. A
// manifest that does not parse references nothing, but then no shard is
// removed either (the damage is reported by verify, not made worse). Returns
// the names removed.
std::vector<std::string> cleanup_cache_directory(const std::string& directory);

}  // namespace leanloader::detail
