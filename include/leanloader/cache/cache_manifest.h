// The TensorCache manifest: which sample key lives in which shard, at which
// offsets, and the fingerprint of the source it was computed from.
//
// On disk it is one JSON file, `manifest.json` in the cache directory
// (`manifest.rank<r>.json` for the part a distributed rank wrote):
//
//   {"format": "leanloader-tensor-cache", "version": 1,
//    "shards": [{"file": "shard-000001-9f3a.safetensors", "bytes": 268435456}, ...],
//    "entries": [{"key": "img/0001.png", "shard": 0, "slot": 17,
//                 "fingerprint": {"path": "img/0001.png", "size": 81234,
//                                 "mtime_ns": 1700000000000000000,
//                                 "content_hash": "", "config": "sha256:..."},
//                 "tensors": [{"name": "latent", "dtype": "F16", "shape": [16, 128, 128],
//                              "offset": 4096, "nbytes": 524288}, ...]}, ...]}
//
// A shard is a safetensors file whose tensor "<slot>/<name>" is tensor
// <name> of the entry with that slot; "offset" is the absolute byte offset of
// its data in the shard file. The manifest is read from untrusted bytes:
// parse_cache_manifest validates everything a reader relies on (see there)
// and has a fuzz target.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "leanloader/core/dtype.h"
#include "leanloader/core/tensor.h"

namespace leanloader {

inline constexpr std::string_view kCacheManifestFormat = "leanloader-tensor-cache";
inline constexpr uint64_t kCacheManifestVersion = 1;
inline constexpr std::string_view kCacheManifestName = "manifest.json";

// Where a cached sample came from and how it was encoded. Two fingerprints
// match (the entry is fresh) when the encode configuration is the same and
// - with a content hash: the hashes and sizes are equal (a touched but
//   unchanged file stays fresh, a moved one too);
// - without: path, size and mtime_ns are equal (any touch or rewrite makes
//   the entry stale). Paths are absolute (a relative one named another
//   file from another working directory); a relative path stored by an
//   earlier version matches an absolute one that ends with it, as it
//   matched before.
// Samples that are not files (array rows) have an empty path and size and
// mtime_ns 0: only the configuration (and a caller-given content_hash) counts.
struct SourceFingerprint {
  std::string path;
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  std::string content_hash;  // "xxh64:<hex>" or caller-defined; empty when not asked for
  std::string config;        // hash of the encode configuration, caller-defined
  bool operator==(const SourceFingerprint&) const = default;
};

bool fingerprint_matches(const SourceFingerprint& stored, const SourceFingerprint& current);

// The fingerprint of the file at `path` now: its absolute path (made from
// the working directory, symbolic links kept), stat (size, mtime_ns) and,
// when `with_content_hash`, the XXH64 of its bytes. Throws IoError.
SourceFingerprint fingerprint_file(const std::string& path, bool with_content_hash,
                                   const std::string& config);

struct CacheTensorRecord {
  std::string name;
  DType dtype = DType::kU8;
  Shape shape;
  uint64_t offset = 0;  // absolute byte offset in the shard file
  uint64_t nbytes = 0;  // == shape_numel(shape) * dtype_size(dtype)
  // "xxh64:<16 hex digits>" of the tensor's bytes as written (verify()'s
  // check of the data); empty in manifests written before checksums were.
  std::string checksum;
};

struct CacheEntry {
  std::string key;
  uint32_t shard = 0;  // index into CacheManifest::shards
  uint64_t slot = 0;   // the entry's number inside its shard ("<slot>/<name>")
  SourceFingerprint fingerprint;
  std::vector<CacheTensorRecord> tensors;
};

struct CacheShard {
  std::string file;  // a plain file name inside the cache directory
  uint64_t bytes = 0;
};

struct CacheManifest {
  std::vector<CacheShard> shards;
  std::vector<CacheEntry> entries;  // keys are unique
};

// Name of the safetensors tensor that holds tensor `name` of slot `slot`.
std::string cache_shard_tensor_name(uint64_t slot, const std::string& name);

// Parses and validates a manifest. Throws FormatError("'<path>': <what>")
// naming the entry and the rule for: bad JSON or UTF-8, a missing or
// unknown member, a wrong type, another format or version, a shard file
// name that is not a plain "*.safetensors" name in the directory (no '/',
// no leading '.'), a repeated shard file, a shard index out of range, a
// repeated key, a repeated (shard, slot), a repeated tensor name within an
// entry, an unknown dtype, nbytes != shape x dtype size (or overflow), and a
// tensor range past the shard's byte count. Thread-safe (pure function).
CacheManifest parse_cache_manifest(std::string_view text, const std::string& path_for_messages);

// The manifest as JSON text (one line per entry, so that it diffs and greps).
std::string format_cache_manifest(const CacheManifest& manifest);

// Reads and parses `path`. Throws IoError (kNotFound when missing) or
// FormatError.
CacheManifest read_cache_manifest(const std::string& path);

// Writes `manifest` to `path` atomically: temp file in the same directory,
// fsync, rename, fsync of the directory. Readers see the old manifest or the
// new one. Throws IoError after removing the temp file.
void publish_cache_manifest(const std::string& path, const CacheManifest& manifest);

// Adds or replaces (by key) `entry`, whose shard index refers to
// `entry_shards`, in `into`: shards are appended when `into` lacks them (by
// file name), entries with the same key are replaced. Shards that no entry
// references any more are dropped from the list; their file names are
// returned, for the writer to mark them discardable before it publishes (see
// detail/cache_directory.h). Used by the writer and by the rank merge.
std::vector<std::string> merge_cache_manifest(CacheManifest& into, const CacheManifest& from);

// Drops shards no entry references and renumbers the entries' shard indices.
// Returns the file names dropped.
std::vector<std::string> drop_unreferenced_shards(CacheManifest& manifest);

}  // namespace leanloader
