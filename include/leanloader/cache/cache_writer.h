// CacheWriter: appends samples (key, fingerprint, named tensors) to a
// TensorCache directory, many samples per safetensors shard.
//
// Publishing protocol (what makes a crash at any byte harmless):
// 1. Samples accumulate in memory (copied; up to `shard_bytes`, the writer's
//    memory bill) until the target size is reached or flush() is called.
// 2. The shard is written by save_safetensors: temp file, fsync, rename to a
//    fresh name "shard-[r<rank>-]<seq>-<random>.safetensors", fsync of the
//    directory. A name is never reused, so no reader ever sees a shard change.
// 3. The manifest that references it is published the same way. Only then
//    do readers see the new entries; until then they see the old manifest,
//    which references only complete shards. A crash between 2 and 3 leaves an
//    unreferenced shard, removed by the next clean-up (see
//    detail/cache_directory.h for the lock that makes that safe).
// Re-adding a key replaces its entry in the manifest; the old bytes stay in
// their shard as garbage until every entry of that shard is superseded, when
// the shard leaves the manifest and is removed by a later clean-up.
// (Compaction of partly superseded shards is not implemented.)
//
// Distributed builds: with `rank` set, the writer publishes its entries in
// "manifest.rank<r>.json" (not manifest.json) and prefixes its shards with
// "r<r>-", so ranks never touch each other's files; after all ranks have
// flushed, one process calls merge_cache_rank_manifests().
//
// Thread-safety: one thread drives a CacheWriter. Several writers (ranks) may
// share a directory only with distinct ranks.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "leanloader/cache/cache_manifest.h"
#include "leanloader/core/tensor.h"

namespace leanloader {

namespace detail {
class CacheLock;
}

inline constexpr size_t kDefaultCacheShardBytes = size_t{256} << 20;

struct CacheWriterOptions {
  size_t shard_bytes = kDefaultCacheShardBytes;  // publish a shard once this many bytes wait
  std::optional<int> rank;                       // distributed build: this process's rank
};

class CacheWriter {
 public:
  // Creates the directory when missing, takes the cache's shared lock (after
  // cleaning up a crashed writer's leftovers when nobody else has the cache
  // open) and loads the current manifest: manifest.json, plus this rank's own
  // part from an interrupted run, or (without a rank) every leftover rank
  // part, which is merged into manifest.json first. Throws IoError,
  // FormatError (a manifest that does not parse), InvalidArgument.
  CacheWriter(std::string directory, CacheWriterOptions options = {});
  ~CacheWriter();
  CacheWriter(const CacheWriter&) = delete;
  CacheWriter& operator=(const CacheWriter&) = delete;

  // True when `key` has a published entry whose fingerprint matches.
  bool is_fresh(const std::string& key, const SourceFingerprint& fingerprint) const;

  // Queues a sample; its tensors' bytes are copied now (the caller may reuse
  // them). Publishes a shard when the queue reaches shard_bytes. Every sample
  // of a cache must have the same tensor names and dtypes (shapes may vary):
  // throws InvalidArgument naming the key otherwise, or for no tensors, an
  // empty or repeated name.
  void add(const std::string& key, const SourceFingerprint& fingerprint,
           const std::vector<std::pair<std::string, Tensor>>& tensors);

  // Publishes the queued samples (shard, then manifest). Also publishes an
  // empty manifest when the cache has none yet, so that a finished build
  // always leaves a cache that opens. Idempotent.
  void flush();

  // The entries published so far (including those loaded at construction).
  const CacheManifest& manifest() const noexcept { return visible_; }
  size_t pending_samples() const noexcept { return pending_.size(); }
  size_t pending_bytes() const noexcept { return pending_bytes_; }
  size_t shards_published() const noexcept { return shards_published_; }
  const std::string& directory() const noexcept { return directory_; }

 private:
  struct PendingSample {
    std::string key;
    SourceFingerprint fingerprint;
    std::vector<std::pair<std::string, Tensor>> tensors;  // owned copies
    size_t bytes = 0;
  };

  void check_schema(const std::string& key,
                    const std::vector<std::pair<std::string, Tensor>>& tensors);
  // Publishes `added` (entries and shards this writer has just written):
  // into its rank part, or merged into manifest.json as it is on disk now,
  // under detail::ManifestWriteLock (another writer may have published since
  // this one read it).
  void publish_manifest(const CacheManifest& added);
  std::string next_shard_name();

  std::string directory_;
  CacheWriterOptions options_;
  std::unique_ptr<detail::CacheLock> lock_;
  CacheManifest visible_;  // what is published: manifest.json (+ own rank part)
  CacheManifest part_;     // rank mode: the entries this rank published
  std::unordered_map<std::string, size_t> visible_index_;  // key -> entry in visible_
  std::vector<PendingSample> pending_;
  size_t pending_bytes_ = 0;
  size_t shards_published_ = 0;
  uint64_t next_seq_ = 1;
  bool manifest_exists_ = false;
  // The schema every sample follows: (name, dtype) in first-seen order.
  std::vector<std::pair<std::string, DType>> schema_;
};

// Merges every "manifest.rank<r>.json" of `directory` into manifest.json
// (later ranks win for a repeated key), publishes it atomically, then removes
// the parts. Run by one process after every rank has flushed (a barrier). A
// crash part-way leaves parts that a later merge or writer applies again
// (merging is idempotent). Returns the number of parts merged.
size_t merge_cache_rank_manifests(const std::string& directory);

}  // namespace leanloader
