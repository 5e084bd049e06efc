#include "leanloader/cache/cache_writer.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <random>
#include <unordered_set>

#include "cache/cache_directory.h"
#include "leanloader/core/error.h"
#include "leanloader/io/content_hash.h"
#include "leanloader/io/safetensors.h"

namespace leanloader {

namespace {

void make_directories(const std::string& path) {
  std::string partial;
  size_t start = 0;
  while (start <= path.size()) {
    const size_t slash = path.find('/', start);
    const size_t end = slash == std::string::npos ? path.size() : slash;
    partial = path.substr(0, end);
    if (!partial.empty() && ::mkdir(partial.c_str(), 0777) != 0 && errno != EEXIST) {
      throw IoError("cannot create directory", partial, errno);
    }
    if (slash == std::string::npos) break;
    start = slash + 1;
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw IoError("cannot stat", path, errno);
  if (!S_ISDIR(st.st_mode)) throw IoError("not a directory", path, ENOTDIR);
}

std::string rank_part_name(int rank) { return "manifest.rank" + std::to_string(rank) + ".json"; }

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

std::vector<std::string> rank_part_names(const std::string& directory) {
  std::vector<std::string> parts;
  for (const std::string& name : detail::list_files(directory)) {
    if (detail::is_rank_manifest_name(name)) parts.push_back(name);
  }
  // Numeric order, so that "later ranks win" means rank numbers.
  std::sort(parts.begin(), parts.end(), [](const std::string& a, const std::string& b) {
    return std::stoll(a.substr(13)) < std::stoll(b.substr(13));
  });
  return parts;
}

// Merges the parts into manifest.json and removes them. Caller holds the
// shared lock.
size_t merge_parts_locked(const std::string& directory) {
  const std::vector<std::string> parts = rank_part_names(directory);
  if (parts.empty()) return 0;
  const std::string main_path = detail::join_path(directory, std::string(kCacheManifestName));
  const detail::ManifestWriteLock writing(directory);
  CacheManifest merged;
  if (file_exists(main_path)) merged = read_cache_manifest(main_path);
  std::vector<std::string> superseded;
  for (const std::string& part : parts) {
    for (std::string& shard :
         merge_cache_manifest(merged, read_cache_manifest(detail::join_path(directory, part)))) {
      superseded.push_back(std::move(shard));
    }
  }
  detail::mark_discardable(directory, superseded);
  publish_cache_manifest(main_path, merged);
  for (const std::string& part : parts) {
    const std::string path = detail::join_path(directory, part);
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) throw IoError("cannot remove", path, errno);
  }
  detail::fsync_directory(directory);
  return parts.size();
}

std::shared_ptr<HeapStorage> copy_bytes(const Tensor& tensor) {
  std::shared_ptr<HeapStorage> storage =
      HeapStorage::allocate(std::max<size_t>(tensor.nbytes(), 1));
  if (tensor.nbytes() == 0) return storage;
  if (tensor.is_contiguous()) {
    std::memcpy(storage->data(), tensor.data(), tensor.nbytes());
  } else {
    tensor.copy_to(storage->data());
  }
  return storage;
}

}  // namespace

CacheWriter::CacheWriter(std::string directory, CacheWriterOptions options)
    : directory_(std::move(directory)), options_(options) {
  if (options_.shard_bytes == 0) throw InvalidArgument("shard_bytes must be positive");
  if (options_.rank && *options_.rank < 0) {
    throw InvalidArgument("rank must be non-negative, got " + std::to_string(*options_.rank));
  }
  make_directories(directory_);
  lock_ = std::make_unique<detail::CacheLock>(
      detail::CacheLock::open_shared(directory_, /*cleanup=*/true, nullptr));

  const std::string main_path = detail::join_path(directory_, std::string(kCacheManifestName));
  if (!options_.rank) merge_parts_locked(directory_);
  manifest_exists_ = file_exists(main_path);
  if (manifest_exists_) visible_ = read_cache_manifest(main_path);
  if (options_.rank) {
    const std::string own = detail::join_path(directory_, rank_part_name(*options_.rank));
    if (file_exists(own)) {
      part_ = read_cache_manifest(own);
      merge_cache_manifest(visible_, part_);
    }
  }
  for (size_t e = 0; e < visible_.entries.size(); ++e) {
    visible_index_.emplace(visible_.entries[e].key, e);
  }
  if (!visible_.entries.empty()) {
    for (const CacheTensorRecord& tensor : visible_.entries.front().tensors) {
      schema_.emplace_back(tensor.name, tensor.dtype);
    }
  }
  next_seq_ = visible_.shards.size() + 1;
}

CacheWriter::~CacheWriter() = default;

bool CacheWriter::is_fresh(const std::string& key, const SourceFingerprint& fingerprint) const {
  const auto it = visible_index_.find(key);
  if (it == visible_index_.end()) return false;
  return fingerprint_matches(visible_.entries[it->second].fingerprint, fingerprint);
}

void CacheWriter::check_schema(const std::string& key,
                               const std::vector<std::pair<std::string, Tensor>>& tensors) {
  if (tensors.empty()) throw InvalidArgument("cache entry '" + key + "' has no tensors");
  std::unordered_set<std::string> names;
  for (const auto& [name, tensor] : tensors) {
    if (name.empty()) throw InvalidArgument("cache entry '" + key + "' has a tensor with no name");
    if (!names.insert(name).second) {
      throw InvalidArgument("cache entry '" + key + "' has tensor '" + name + "' twice");
    }
    if (tensor.storage() == nullptr) {
      throw InvalidArgument("cache entry '" + key + "': tensor '" + name + "' has no storage");
    }
    if (!dtype_in_safetensors(tensor.dtype())) {  // shards are safetensors files
      throw InvalidArgument("cache entry '" + key + "': tensor '" + name + "' is " +
                            std::string(dtype_name(tensor.dtype())) +
                            ", which the cache's safetensors shards cannot hold (complex64 can)");
    }
  }
  if (schema_.empty()) {
    for (const auto& [name, tensor] : tensors) schema_.emplace_back(name, tensor.dtype());
    return;
  }
  auto describe = [](const auto& pairs) {
    std::string out;
    for (const auto& [name, dtype] : pairs) {
      out += (out.empty() ? "" : ", ") + name + ":" + std::string(dtype_name(dtype));
    }
    return "{" + out + "}";
  };
  std::map<std::string, DType> expected(schema_.begin(), schema_.end());
  std::map<std::string, DType> got;
  for (const auto& [name, tensor] : tensors) got.emplace(name, tensor.dtype());
  if (expected != got) {
    throw InvalidArgument("cache entry '" + key + "' has tensors " + describe(got) +
                          " but the cache's entries have " + describe(expected) +
                          " (every entry needs the same names and dtypes)");
  }
}

void CacheWriter::add(const std::string& key, const SourceFingerprint& fingerprint,
                      const std::vector<std::pair<std::string, Tensor>>& tensors) {
  check_schema(key, tensors);
  PendingSample sample;
  sample.key = key;
  sample.fingerprint = fingerprint;
  // Stored in schema order, so that every entry lists its tensors alike.
  for (const auto& field : schema_) {
    const std::string& name = field.first;
    const auto it = std::find_if(tensors.begin(), tensors.end(),
                                 [&](const auto& pair) { return pair.first == name; });
    const Tensor& tensor = it->second;
    sample.tensors.emplace_back(name,
                                Tensor(copy_bytes(tensor), 0, tensor.dtype(), tensor.shape()));
    sample.bytes += tensor.nbytes();
  }
  // A key queued twice keeps its latest sample only.
  const auto previous = std::find_if(pending_.begin(), pending_.end(),
                                     [&](const PendingSample& p) { return p.key == key; });
  if (previous != pending_.end()) {
    pending_bytes_ -= previous->bytes;
    pending_.erase(previous);
  }
  pending_bytes_ += sample.bytes;
  pending_.push_back(std::move(sample));
  if (pending_bytes_ >= options_.shard_bytes) flush();
}

std::string CacheWriter::next_shard_name() {
  static thread_local std::mt19937_64 generator{std::random_device{}() ^
                                                static_cast<uint64_t>(::getpid())};
  static constexpr char kHex[] = "0123456789abcdef";
  uint64_t bits = generator();
  std::string suffix;
  for (int i = 0; i < 8; ++i, bits >>= 4) suffix.push_back(kHex[bits & 0xF]);
  std::string seq = std::to_string(next_seq_++);
  if (seq.size() < 6) seq.insert(0, 6 - seq.size(), '0');
  const std::string rank = options_.rank ? "r" + std::to_string(*options_.rank) + "-" : "";
  return "shard-" + rank + seq + "-" + suffix + ".safetensors";
}

void CacheWriter::flush() {
  if (pending_.empty()) {
    if (!manifest_exists_ && !options_.rank) publish_manifest(CacheManifest{});
    return;
  }
  const std::string name = next_shard_name();
  const std::string path = detail::join_path(directory_, name);
  // Marked before it exists: a crash before its manifest lands leaves an
  // orphan that clean-up knows to be this cache's own.
  detail::mark_discardable(directory_, {name});
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (size_t slot = 0; slot < pending_.size(); ++slot) {
    for (const auto& [tensor_name, tensor] : pending_[slot].tensors) {
      tensors.emplace_back(cache_shard_tensor_name(slot, tensor_name), tensor);
    }
  }
  save_safetensors(
      path, tensors,
      std::map<std::string, std::string>{{"format", "leanloader-tensor-cache-shard"},
                                         {"samples", std::to_string(pending_.size())}});
  // The offsets as written, read back from the published file itself.
  const SafetensorsHeader header = read_safetensors_header(path);
  std::unordered_map<std::string, const SafetensorsEntry*> by_name;
  uint64_t end = 0;
  for (const SafetensorsEntry& entry : header.tensors) {
    by_name.emplace(entry.name, &entry);
    end = std::max(end, entry.end);
  }
  CacheManifest published;
  published.shards.push_back({name, header.data_offset + end});
  for (size_t slot = 0; slot < pending_.size(); ++slot) {
    CacheEntry entry;
    entry.key = pending_[slot].key;
    entry.shard = 0;
    entry.slot = slot;
    entry.fingerprint = pending_[slot].fingerprint;
    for (const auto& [tensor_name, tensor] : pending_[slot].tensors) {
      const SafetensorsEntry& written = *by_name.at(cache_shard_tensor_name(slot, tensor_name));
      // Hashed from the bytes handed to the writer, which the shard holds
      // as they are: verify(check_data) reads them back against it.
      const std::byte* bytes = tensor.data();
      entry.tensors.push_back({tensor_name, written.dtype, written.shape,
                               header.data_offset + written.begin, written.end - written.begin,
                               xxh64_text(xxh64({bytes, tensor.nbytes()}))});
    }
    published.entries.push_back(std::move(entry));
  }
  pending_.clear();
  pending_bytes_ = 0;
  ++shards_published_;
  publish_manifest(published);
  detail::unmark_discardable(directory_, name);
}

void CacheWriter::publish_manifest(const CacheManifest& added) {
  if (options_.rank) {
    CacheManifest part = part_;
    detail::mark_discardable(directory_, merge_cache_manifest(part, added));
    part_ = std::move(part);
    merge_cache_manifest(visible_, added);
    publish_cache_manifest(detail::join_path(directory_, rank_part_name(*options_.rank)), part_);
  } else {
    // manifest.json as it is now, not as this writer read it: another
    // writer's entries published since are kept (a copy read at the start
    // and written back whole lost them: two builds of one cache, 200 + 200
    // entries, left 200).
    const detail::ManifestWriteLock writing(directory_);
    const std::string main_path = detail::join_path(directory_, std::string(kCacheManifestName));
    CacheManifest current = file_exists(main_path) ? read_cache_manifest(main_path) : visible_;
    detail::mark_discardable(directory_, merge_cache_manifest(current, added));
    publish_cache_manifest(main_path, current);
    visible_ = std::move(current);
    manifest_exists_ = true;
  }
  visible_index_.clear();
  for (size_t e = 0; e < visible_.entries.size(); ++e) {
    visible_index_.emplace(visible_.entries[e].key, e);
  }
}

size_t merge_cache_rank_manifests(const std::string& directory) {
  const detail::CacheLock lock = detail::CacheLock::open_shared(directory, false, nullptr);
  return merge_parts_locked(directory);
}

}  // namespace leanloader
