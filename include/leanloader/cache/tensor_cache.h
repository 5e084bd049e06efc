// TensorCache: tensors computed once (latents, text embeddings) and read
// back by every thread and process through shared, memory-mapped files.
//
// Two layouts are read, chosen by what the directory holds:
// - sharded (written by CacheWriter): manifest.json + shard-*.safetensors,
//   many samples per shard (see cache_manifest.h, cache_writer.h). Shards are
//   mapped once per TensorCache, lazily on first use, and shared by all
//   threads; the pages are page cache, counted once however many processes
//   read them.
// - per-sample files (no manifest.json, *.safetensors files, e.g. a trainer's
//   `_latent_cache/`): each file is one sample whose key is the file stem,
//   in sorted order; read_sample preads the file's header and data straight
//   into the batch slot (no mapping: a folder of 100k files would otherwise
//   exhaust the process's mapping count). A single .safetensors path is a
//   cache of one sample.
//
// Source contract: fields() are the tensor names and dtypes every entry
// shares (in the first entry's order), the shape fixed when all entries
// agree; read_sample(i) is one pread per tensor from the shard (page cache)
// into the writer's buffer: the batch's gather copy. entry(i) views the
// mapping instead (zero-copy).
//
// Snapshots: the state (manifest or folder listing, fields, the shard set
// and its lazily mapped shards, the directory's shared lock) is an immutable
// snapshot; snapshot() hands it out as a Source of its own. reload() (and so
// every build()) publishes a new snapshot and never changes one in use: a
// Loader reads one snapshot per epoch and picks up a new one at the start of
// its next epoch (LoaderOptions::follow_updates). A snapshot holds the
// directory's shared lock (see src/cache/cache_directory.h), so no other
// process's clean-up deletes the shards it maps, even after the TensorCache
// itself is gone.
//
// Thread-safety: everything is safe to call from any thread. A read takes the
// current snapshot once, so it sees one consistent manifest. Within a
// snapshot the lazy shard table is guarded by a mutex (a mapped shard is then
// read lock-free).
// reload() keeps indices stable for a cache that only grows or replaces
// entries (what CacheWriter does: a replaced key keeps its position, new keys
// are appended), so a Loader made before a rebuild keeps reading the same
// keys. Field names and dtypes are fixed once the cache has entries.
// Lifetime: tensors returned by entry() keep their mapping alive after the
// TensorCache is gone.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "leanloader/cache/cache_manifest.h"
#include "leanloader/io/safetensors.h"
#include "leanloader/sources/source.h"

namespace leanloader {

namespace detail {
class CacheLock;
}

// One finding of TensorCache::verify().
struct CacheProblem {
  // "invalid": a file or entry that does not read back as the manifest says;
  // "stale": the source changed since the entry was built (or is gone);
  // "partial": a leftover of an interrupted write (temp file, unmerged rank
  // manifest);
  // "garbage": a shard no manifest references (written before a crash, or
  // all of its entries superseded). Readers never see it; not an error;
  // "corrupt" (with check_data): a tensor whose bytes no longer hash to the
  // checksum written with them (the shard changed on disk).
  std::string kind;
  std::string where;  // the file, or "<shard> key <key>"
  std::string message;
};

class TensorCache final : public Source {
 public:
  enum class Layout { kSharded, kPerSampleFiles };

  // Opens `path`: a cache directory, a folder of per-sample files, or one
  // .safetensors file. With `cleanup`, removes a crashed writer's temp files
  // and unreferenced shards first, when no other process has the cache open.
  // A directory without manifest and without .safetensors files is an empty
  // sharded cache. Throws IoError (kNotFound), FormatError naming the
  // manifest and entry (bad JSON, or entries whose tensor names or dtypes
  // differ), InvalidArgument.
  static std::shared_ptr<TensorCache> open(const std::string& path, bool cleanup = true);
  explicit TensorCache(const std::string& path, bool cleanup = true);
  ~TensorCache() override;
  TensorCache(const TensorCache&) = delete;
  TensorCache& operator=(const TensorCache&) = delete;

  // Re-reads the manifest (or the folder) as it is now and publishes it as
  // the new snapshot. Throws like open(), and InvalidArgument when the
  // entries' field names or dtypes changed.
  void reload();

  // The current snapshot: an immutable Source (size, fields, samples) that
  // later reloads do not touch. Reloads first when the cache on disk changed
  // since the current snapshot was read (a build by another process or
  // another TensorCache object: one stat of the manifest, the folder or the
  // file).
  std::shared_ptr<const Source> snapshot() const override;

  // The current snapshot's.
  int64_t size() const override;
  // The current snapshot's fields. The reference stays valid for the life of
  // the TensorCache (field lists replaced by a reload are kept).
  const std::vector<FieldSpec>& fields() const override;
  void read_sample(int64_t index, SampleWriter& writer) const override;
  std::string describe() const override;
  std::string sample_location(int64_t index) const override;
  size_t estimated_sample_bytes() const override;
  // The current snapshot's (see Source): gathers that waited for storage,
  // and a read-ahead hint for a sample of an already open shard.
  uint64_t storage_reads() const override;
  void will_need(int64_t index) const noexcept override;

  Layout layout() const;
  const std::string& path() const noexcept { return path_; }
  // Sharded: the manifest. Per-sample files: one "shard" per file (with
  // slot 0), whose entries carry the files' headers (failed files have no
  // tensors).
  // The returned manifest is a snapshot's and stays valid as long as the
  // shared_ptr is held.
  std::shared_ptr<const CacheManifest> manifest() const;
  std::string key(int64_t index) const;
  std::optional<int64_t> find(const std::string& key) const;
  // Full path of shard (or per-sample file) `shard`.
  std::string shard_path(uint32_t shard) const;
  // Files removed by clean-up when this cache was opened.
  const std::vector<std::string>& removed_on_open() const noexcept { return removed_; }

  // The tensors of entry `index` as zero-copy views of the mapped shard (a
  // per-sample file is mapped for the call; misaligned data is copied), in
  // field order. Throws InvalidArgument (index) or FormatError / IoError
  // naming the file and entry.
  std::vector<std::pair<std::string, Tensor>> entry(int64_t index) const;

  // Checks every shard or file and entry: readable, valid safetensors, and as
  // the manifest says; leftovers of interrupted writes; with `check_sources`,
  // whether each entry's source file still has its fingerprint (stat, or the
  // content hash when the entry has one); with `check_data`, whether every
  // tensor's bytes still hash to the checksum written with them (reads the
  // whole cache; entries written before checksums were are not checked).
  // Never throws for a problem in the cache; returns them all (empty = all
  // is well).
  std::vector<CacheProblem> verify(bool check_sources = true, bool check_data = false) const;

 private:
  class State;
  std::shared_ptr<const State> state() const;
  std::shared_ptr<const State> load_state(bool cleanup);

  std::string path_;  // as given
  std::vector<std::string> removed_;
  std::shared_ptr<const detail::CacheLock> lock_;  // shared with every snapshot

  std::mutex reload_mutex_;  // one reload() at a time
  mutable std::mutex state_mutex_;
  std::shared_ptr<const State> state_;
  // Every field list a snapshot of this cache had, so that fields()
  // references outlive reloads; grows only when the fields change.
  std::vector<std::shared_ptr<const std::vector<FieldSpec>>> field_lists_;
};

}  // namespace leanloader
