#include "io/file_handle_cache.h"

#include <sys/resource.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>

#include "leanloader/core/error.h"

namespace leanloader::detail {

namespace {

size_t default_budget() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return 512;
  return std::clamp<size_t>(static_cast<size_t>(limit.rlim_cur) / 4, 16, 512);
}

}  // namespace

FileHandleCache::FileHandleCache(size_t budget)
    : budget_(budget != 0 ? budget : default_budget()) {}

size_t FileHandleCache::add(const std::string& path) {
  auto file = std::make_shared<const File>(path);
  const FileIdentity identity = FileIdentity::of(path);
  std::lock_guard lock(mutex_);
  const size_t key = entries_.size();
  Entry& entry = entries_.emplace_back();
  entry.path = path;
  entry.identity = identity;
  entry.file = std::move(file);
  entry.position = open_.end();
  touch_locked(entry, key);
  return key;
}

void FileHandleCache::touch_locked(Entry& entry, size_t key) {
  if (entry.position != open_.end()) open_.erase(entry.position);
  open_.push_front(key);
  entry.position = open_.begin();
  while (open_.size() > budget_) {
    Entry& oldest = entries_[open_.back()];
    oldest.file.reset();  // closes once its last reader lets go
    oldest.position = open_.end();
    open_.pop_back();
  }
}

std::shared_ptr<const File> FileHandleCache::open_locked(Entry& entry, size_t key) {
  auto file = std::make_shared<const File>(entry.path);
  entry.identity.check_unchanged(entry.path);
  entry.file = file;
  touch_locked(entry, key);
  return file;
}

std::shared_ptr<const File> FileHandleCache::get(size_t key) {
  std::lock_guard lock(mutex_);
  Entry& entry = entries_.at(key);
  if (entry.file) {
    if (entry.position != open_.begin()) touch_locked(entry, key);
    return entry.file;
  }
  return open_locked(entry, key);
}

std::pair<std::string, FileIdentity> FileHandleCache::registered(size_t key) const {
  std::lock_guard lock(mutex_);
  const Entry& entry = entries_.at(key);
  return {entry.path, entry.identity};
}

void FileHandleCache::check_unchanged(size_t key) const {
  const auto [path, identity] = registered(key);
  identity.check_unchanged(path);
}

bool FileHandleCache::unchanged(size_t key) const {
  const auto [path, identity] = registered(key);
  return identity.unchanged(path);
}

size_t FileHandleCache::open_count() const {
  std::lock_guard lock(mutex_);
  return open_.size();
}

}  // namespace leanloader::detail
