#include "cache/cache_directory.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <set>

#include "io/file_io.h"
#include "leanloader/cache/cache_manifest.h"
#include "leanloader/core/error.h"

namespace leanloader::detail {

std::string join_path(const std::string& directory, const std::string& name) {
  if (directory.empty()) return name;
  if (directory.back() == '/') return directory + name;
  return directory + "/" + name;
}

bool ends_with(std::string_view text, std::string_view suffix) noexcept {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}

bool starts_with(std::string_view text, std::string_view prefix) noexcept {
  return text.substr(0, prefix.size()) == prefix;
}

std::vector<std::string> list_files(const std::string& directory) {
  std::vector<std::string> names;
  for (const DirectoryEntry& entry : list_directory(directory)) {
    bool regular = entry.type == DT_REG;
    if (entry.type == DT_UNKNOWN || entry.type == DT_LNK) {
      struct stat st {};
      regular = ::stat(join_path(directory, entry.name).c_str(), &st) == 0 && S_ISREG(st.st_mode);
    }
    if (regular) names.push_back(entry.name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

bool is_shard_name(std::string_view name) noexcept {
  return starts_with(name, "shard-") && ends_with(name, ".safetensors");
}

bool is_rank_manifest_name(std::string_view name) noexcept {
  if (!starts_with(name, "manifest.rank") || !ends_with(name, ".json")) return false;
  const std::string_view digits = name.substr(13, name.size() - 13 - 5);
  return !digits.empty() &&
         std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
}

bool is_cache_temp_name(std::string_view name) noexcept {
  const size_t tmp = name.find(".tmp.");
  if (tmp == std::string_view::npos) return false;
  const std::string_view base = name.substr(0, tmp);
  return is_shard_name(base) || base == kCacheManifestName || is_rank_manifest_name(base);
}

std::string discardable_marker_name(const std::string& shard_name) {
  return shard_name + ".discardable";
}

bool is_discardable_marker_name(std::string_view name) noexcept {
  constexpr std::string_view kSuffix = ".discardable";
  return ends_with(name, kSuffix) && is_shard_name(name.substr(0, name.size() - kSuffix.size()));
}

void mark_discardable(const std::string& directory, const std::vector<std::string>& shard_names) {
  if (shard_names.empty()) return;
  for (const std::string& shard : shard_names) {
    const std::string path = join_path(directory, discardable_marker_name(shard));
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) throw IoError("cannot create the cache's marker", path, errno);
    ::close(fd);
  }
  fsync_directory(directory);
}

void unmark_discardable(const std::string& directory, const std::string& shard_name) noexcept {
  ::unlink(join_path(directory, discardable_marker_name(shard_name)).c_str());
}

void write_file_atomically(const std::string& path, std::string_view bytes) {
  AtomicFileWriter out(path);
  out.write(bytes);
  out.commit();
}

std::string read_text_file(const std::string& path) { return read_whole_file(path); }

CacheLock& CacheLock::operator=(CacheLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

CacheLock::~CacheLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the descriptor releases the flock
}

CacheLock CacheLock::open_shared(const std::string& directory, bool cleanup,
                                 std::vector<std::string>* removed) {
  const std::string path = join_path(directory, ".lock");
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (fd < 0) {
    // On a read-only file system no process can delete a shard, so there is
    // nothing to lock against. Anywhere else a reader without the lock could
    // have its shards cleaned up under it: an error, never silently unlocked.
    if (errno == EROFS) return CacheLock();
    throw IoError(
        "cannot open the cache's lock file for writing (every reader and writer holds it so "
        "that no clean-up deletes shards in use; make the directory writable, or open the "
        "cache where it is)",
        path, errno);
  }
  CacheLock lock(fd);
  if (cleanup) {
    int result;
    do {
      result = ::flock(fd, LOCK_EX | LOCK_NB);
    } while (result != 0 && errno == EINTR);
    if (result == 0) {
      std::vector<std::string> cleaned = cleanup_cache_directory(directory);
      if (removed != nullptr) *removed = std::move(cleaned);
    }
  }
  // Converting exclusive -> shared is not atomic for flock; that is fine:
  // the manifest is read only after the shared lock is held.
  int result;
  do {
    result = ::flock(fd, LOCK_SH);
  } while (result != 0 && errno == EINTR);
  if (result != 0) throw IoError("cannot lock", path, errno);
  return lock;
}

ManifestWriteLock::ManifestWriteLock(const std::string& directory) {
  const std::string path = join_path(directory, ".manifest.lock");
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (fd_ < 0) {
    if (errno == EROFS) return;
    throw IoError("cannot open the cache's manifest lock for writing", path, errno);
  }
  int result;
  do {
    result = ::flock(fd_, LOCK_EX);
  } while (result != 0 && errno == EINTR);
  if (result != 0) {
    const int error = errno;
    ::close(fd_);
    throw IoError("cannot lock the cache's manifest", path, error);
  }
}

ManifestWriteLock::~ManifestWriteLock() {
  if (fd_ >= 0) ::close(fd_);  // closing releases the lock
}

std::vector<std::string> cleanup_cache_directory(const std::string& directory) {
  std::vector<std::string> names = list_files(directory);
  std::set<std::string> referenced;
  bool manifests_readable = true;
  for (const std::string& name : names) {
    if (name != kCacheManifestName && !is_rank_manifest_name(name)) continue;
    try {
      const CacheManifest manifest = read_cache_manifest(join_path(directory, name));
      for (const CacheShard& shard : manifest.shards) referenced.insert(shard.file);
    } catch (const Error&) {
      manifests_readable = false;
    }
  }
  const std::set<std::string> present(names.begin(), names.end());
  std::vector<std::string> removed;
  std::set<std::string> removed_shards;
  auto remove = [&](const std::string& name) {
    if (::unlink(join_path(directory, name).c_str()) != 0) return;
    // Markers are the cache's bookkeeping, not reported.
    if (!is_discardable_marker_name(name)) removed.push_back(name);
    if (is_shard_name(name)) removed_shards.insert(name);
  };
  for (const std::string& name : names) {
    if (is_cache_temp_name(name)) {
      remove(name);
    } else if (manifests_readable && is_shard_name(name) && !referenced.contains(name) &&
               present.contains(discardable_marker_name(name))) {
      remove(name);  // its marker goes below, once the shard is gone
    }
  }
  for (const std::string& name : names) {
    if (!manifests_readable || !is_discardable_marker_name(name)) continue;
    const std::string shard = name.substr(0, name.size() - std::string_view(".discardable").size());
    const bool shard_gone = !present.contains(shard) || removed_shards.contains(shard);
    if (shard_gone || referenced.contains(shard)) remove(name);
  }
  if (!removed.empty()) fsync_directory(directory);
  return removed;
}

}  // namespace leanloader::detail
