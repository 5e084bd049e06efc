#include "leanloader/cache/cache_manifest.h"

#include <sys/stat.h>

#include <cerrno>
#include <limits>
#include <map>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "cache/cache_directory.h"
#include "io/file_io.h"
#include "io/json.h"
#include "leanloader/core/checked_size.h"
#include "leanloader/core/error.h"
#include "leanloader/io/content_hash.h"

namespace leanloader {

namespace {

// `current` is absolute; `stored` too, or relative as earlier versions
// stored a path given relative (it then matches where it resolves to the
// same file name under some working directory, as it did then).
bool paths_match(const std::string& stored, const std::string& current) {
  if (stored == current) return true;
  if (stored.empty() || stored.front() == '/') return false;
  std::string relative = stored;
  while (relative.starts_with("./")) relative.erase(0, 2);
  return current.size() > relative.size() && current.ends_with(relative) &&
         current[current.size() - relative.size() - 1] == '/';
}

}  // namespace

bool fingerprint_matches(const SourceFingerprint& stored, const SourceFingerprint& current) {
  if (stored.config != current.config) return false;
  if (!stored.content_hash.empty() || !current.content_hash.empty()) {
    return stored.content_hash == current.content_hash && stored.size == current.size;
  }
  return paths_match(stored.path, current.path) && stored.size == current.size &&
         stored.mtime_ns == current.mtime_ns;
}

SourceFingerprint fingerprint_file(const std::string& path, bool with_content_hash,
                                   const std::string& config) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw IoError("cannot stat", path, errno);
  SourceFingerprint fingerprint;
  fingerprint.path = detail::absolute_path_as_named(path);
  fingerprint.size = static_cast<uint64_t>(st.st_size);
  fingerprint.mtime_ns =
      static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
  if (with_content_hash) fingerprint.content_hash = content_hash_file(path);
  fingerprint.config = config;
  return fingerprint;
}

std::string cache_shard_tensor_name(uint64_t slot, const std::string& name) {
  return std::to_string(slot) + "/" + name;
}

namespace {

using detail::JsonReader;

// Parses one manifest; every error message names the entry it is in.
class ManifestParser {
 public:
  ManifestParser(std::string_view text, const std::string& path) : reader_(text), path_(path) {}

  CacheManifest parse() {
    CacheManifest manifest;
    bool has_format = false, has_version = false, has_shards = false, has_entries = false;
    reader_.begin_object();
    std::string key;
    while (reader_.next_key(key)) {
      if (key == "format") {
        once(has_format, key, "the manifest");
        if (reader_.read_string() != kCacheManifestFormat) {
          fail("the manifest", "\"format\" is not \"" + std::string(kCacheManifestFormat) + "\"");
        }
      } else if (key == "version") {
        once(has_version, key, "the manifest");
        const uint64_t version = read_uint("the manifest", "version");
        if (version != kCacheManifestVersion) {
          fail("the manifest", "version " + std::to_string(version) +
                                   " is not supported (this build reads version " +
                                   std::to_string(kCacheManifestVersion) + ")");
        }
      } else if (key == "shards") {
        once(has_shards, key, "the manifest");
        expect(JsonReader::Kind::kArray, "the manifest", "\"shards\" must be an array");
        reader_.begin_array();
        while (reader_.next_element())
          manifest.shards.push_back(parse_shard(manifest.shards.size()));
      } else if (key == "entries") {
        once(has_entries, key, "the manifest");
        expect(JsonReader::Kind::kArray, "the manifest", "\"entries\" must be an array");
        reader_.begin_array();
        while (reader_.next_element())
          manifest.entries.push_back(parse_entry(manifest.entries.size()));
      } else {
        fail("the manifest", "unknown member \"" + key + "\"");
      }
    }
    reader_.expect_end();
    if (!has_format || !has_version || !has_shards || !has_entries) {
      fail("the manifest", "\"format\", \"version\", \"shards\" and \"entries\" are required");
    }
    check(manifest);
    return manifest;
  }

 private:
  [[noreturn]] void fail(const std::string& where, const std::string& what) const {
    throw FormatError("'" + path_ + "': " + where + ": " + what);
  }

  void once(bool& seen, const std::string& key, const std::string& where) {
    if (seen) fail(where, "member \"" + key + "\" appears twice");
    seen = true;
  }

  void expect(JsonReader::Kind kind, const std::string& where, const std::string& what) {
    if (reader_.peek() != kind) fail(where, what);
  }

  uint64_t read_uint(const std::string& where, const std::string& name) {
    expect(JsonReader::Kind::kNumber, where, "\"" + name + "\" must be a non-negative integer");
    return reader_.read_uint64();
  }

  std::string read_string(const std::string& where, const std::string& name) {
    expect(JsonReader::Kind::kString, where, "\"" + name + "\" must be a string");
    return reader_.read_string();
  }

  CacheShard parse_shard(size_t index) {
    const std::string where = "shard " + std::to_string(index);
    expect(JsonReader::Kind::kObject, where, "must be an object");
    CacheShard shard;
    bool has_file = false, has_bytes = false;
    reader_.begin_object();
    std::string key;
    while (reader_.next_key(key)) {
      if (key == "file") {
        once(has_file, key, where);
        shard.file = read_string(where, key);
      } else if (key == "bytes") {
        once(has_bytes, key, where);
        shard.bytes = read_uint(where, key);
      } else {
        fail(where, "unknown member \"" + key + "\"");
      }
    }
    if (!has_file || !has_bytes) fail(where, "\"file\" and \"bytes\" are required");
    // The manifest must not make a reader open files outside the directory.
    if (shard.file.empty() || shard.file.find('/') != std::string::npos ||
        shard.file.front() == '.' || shard.file.find('\0') != std::string::npos ||
        !detail::ends_with(shard.file, ".safetensors")) {
      fail(where, "file '" + shard.file +
                      "' is not a plain *.safetensors file name inside the cache directory");
    }
    return shard;
  }

  SourceFingerprint parse_fingerprint(const std::string& where) {
    expect(JsonReader::Kind::kObject, where, "\"fingerprint\" must be an object");
    SourceFingerprint fingerprint;
    bool seen[5] = {};
    reader_.begin_object();
    std::string key;
    while (reader_.next_key(key)) {
      if (key == "path") {
        once(seen[0], key, where);
        fingerprint.path = read_string(where, key);
      } else if (key == "size") {
        once(seen[1], key, where);
        fingerprint.size = read_uint(where, key);
      } else if (key == "mtime_ns") {
        once(seen[2], key, where);
        // Stored as the two's-complement bits: times before 1970 round-trip.
        fingerprint.mtime_ns = static_cast<int64_t>(read_uint(where, key));
      } else if (key == "content_hash") {
        once(seen[3], key, where);
        fingerprint.content_hash = read_string(where, key);
      } else if (key == "config") {
        once(seen[4], key, where);
        fingerprint.config = read_string(where, key);
      } else {
        fail(where, "unknown fingerprint member \"" + key + "\"");
      }
    }
    return fingerprint;
  }

  CacheTensorRecord parse_tensor(const std::string& where) {
    expect(JsonReader::Kind::kObject, where, "each tensor must be an object");
    CacheTensorRecord tensor;
    bool seen[5] = {};
    bool seen_checksum = false;
    reader_.begin_object();
    std::string key;
    while (reader_.next_key(key)) {
      if (key == "name") {
        once(seen[0], key, where);
        tensor.name = read_string(where, key);
      } else if (key == "checksum") {  // optional: absent before checksums were written
        once(seen_checksum, key, where);
        tensor.checksum = read_string(where, key);
      } else if (key == "dtype") {
        once(seen[1], key, where);
        const std::string name = read_string(where, key);
        const auto dtype = dtype_from_name(name);
        if (!dtype || !dtype_in_safetensors(*dtype)) fail(where, "unknown dtype '" + name + "'");
        tensor.dtype = *dtype;
      } else if (key == "shape") {
        once(seen[2], key, where);
        expect(JsonReader::Kind::kArray, where, "\"shape\" must be an array");
        reader_.begin_array();
        while (reader_.next_element()) {
          const uint64_t dim = read_uint(where, "shape");
          if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
            fail(where, "dimension " + std::to_string(dim) + " is too large");
          }
          tensor.shape.push_back(static_cast<int64_t>(dim));
        }
      } else if (key == "offset") {
        once(seen[3], key, where);
        tensor.offset = read_uint(where, key);
      } else if (key == "nbytes") {
        once(seen[4], key, where);
        tensor.nbytes = read_uint(where, key);
      } else {
        fail(where, "unknown tensor member \"" + key + "\"");
      }
    }
    for (const bool s : seen) {
      if (!s) fail(where, "a tensor needs \"name\", \"dtype\", \"shape\", \"offset\", \"nbytes\"");
    }
    const std::optional<size_t> bits = checked_nbits(tensor.shape, tensor.dtype);
    if (!bits) {
      fail(where,
           "tensor '" + tensor.name + "': shape " + shape_to_string(tensor.shape) + " overflows");
    }
    if (*bits % 8 != 0) {
      fail(where, "tensor '" + tensor.name + "': " + shape_to_string(tensor.shape) + " " +
                      std::string(dtype_name(tensor.dtype)) + ": " + kSubbyteMisalignedMessage);
    }
    const uint64_t expected = *bits / 8;
    if (expected != tensor.nbytes) {
      fail(where, "tensor '" + tensor.name + "': nbytes " + std::to_string(tensor.nbytes) +
                      " but " + shape_to_string(tensor.shape) + " " +
                      std::string(dtype_name(tensor.dtype)) + " is " + std::to_string(expected) +
                      " bytes");
    }
    if (tensor.offset > std::numeric_limits<uint64_t>::max() - tensor.nbytes) {
      fail(where, "tensor '" + tensor.name + "': offset + nbytes overflows");
    }
    return tensor;
  }

  CacheEntry parse_entry(size_t index) {
    std::string where = "entry " + std::to_string(index);
    expect(JsonReader::Kind::kObject, where, "must be an object");
    CacheEntry entry;
    bool seen[5] = {};
    reader_.begin_object();
    std::string key;
    while (reader_.next_key(key)) {
      if (key == "key") {
        once(seen[0], key, where);
        entry.key = read_string(where, key);
        where = "entry " + std::to_string(index) + " (key '" + entry.key + "')";
      } else if (key == "shard") {
        once(seen[1], key, where);
        const uint64_t shard = read_uint(where, key);
        if (shard > std::numeric_limits<uint32_t>::max()) fail(where, "shard index too large");
        entry.shard = static_cast<uint32_t>(shard);
      } else if (key == "slot") {
        once(seen[2], key, where);
        entry.slot = read_uint(where, key);
      } else if (key == "fingerprint") {
        once(seen[3], key, where);
        entry.fingerprint = parse_fingerprint(where);
      } else if (key == "tensors") {
        once(seen[4], key, where);
        expect(JsonReader::Kind::kArray, where, "\"tensors\" must be an array");
        reader_.begin_array();
        while (reader_.next_element()) entry.tensors.push_back(parse_tensor(where));
      } else {
        fail(where, "unknown member \"" + key + "\"");
      }
    }
    for (const bool s : seen) {
      if (!s)
        fail(where, "an entry needs \"key\", \"shard\", \"slot\", \"fingerprint\", \"tensors\"");
    }
    return entry;
  }

  // Rules that span entries.
  void check(const CacheManifest& manifest) const {
    std::unordered_set<std::string> files;
    for (size_t s = 0; s < manifest.shards.size(); ++s) {
      if (!files.insert(manifest.shards[s].file).second) {
        fail("shard " + std::to_string(s),
             "file '" + manifest.shards[s].file + "' is listed twice");
      }
    }
    std::unordered_set<std::string> keys;
    std::set<std::pair<uint32_t, uint64_t>> slots;
    for (size_t e = 0; e < manifest.entries.size(); ++e) {
      const CacheEntry& entry = manifest.entries[e];
      const std::string where = "entry " + std::to_string(e) + " (key '" + entry.key + "')";
      if (!keys.insert(entry.key).second) fail(where, "the key appears twice");
      if (entry.shard >= manifest.shards.size()) {
        fail(where, "shard " + std::to_string(entry.shard) + " does not exist (" +
                        std::to_string(manifest.shards.size()) + " shards)");
      }
      if (!slots.insert({entry.shard, entry.slot}).second) {
        fail(where, "slot " + std::to_string(entry.slot) + " of shard " +
                        std::to_string(entry.shard) + " is used twice");
      }
      const uint64_t shard_bytes = manifest.shards[entry.shard].bytes;
      std::unordered_set<std::string> names;
      for (const CacheTensorRecord& tensor : entry.tensors) {
        if (!names.insert(tensor.name).second) {
          fail(where, "tensor '" + tensor.name + "' appears twice");
        }
        if (tensor.offset + tensor.nbytes > shard_bytes) {
          fail(where, "tensor '" + tensor.name + "' at [" + std::to_string(tensor.offset) + ", " +
                          std::to_string(tensor.offset + tensor.nbytes) +
                          ") lies past the end of its shard (" + std::to_string(shard_bytes) +
                          " bytes)");
        }
      }
    }
  }

  JsonReader reader_;
  const std::string& path_;
};

}  // namespace

CacheManifest parse_cache_manifest(std::string_view text, const std::string& path_for_messages) {
  if (const auto bad = detail::find_invalid_utf8(text)) {
    throw FormatError("'" + path_for_messages + "': the manifest is not UTF-8 (byte " +
                      std::to_string(*bad) + ")");
  }
  try {
    return ManifestParser(text, path_for_messages).parse();
  } catch (const detail::JsonError& error) {
    throw FormatError("'" + path_for_messages + "': the manifest is not valid JSON at byte " +
                      std::to_string(error.offset()) + ": " + error.what());
  }
}

std::string format_cache_manifest(const CacheManifest& manifest) {
  std::string out = "{\"format\":";
  detail::append_json_string(out, kCacheManifestFormat);
  out += ",\"version\":" + std::to_string(kCacheManifestVersion) + ",\n\"shards\":[";
  for (size_t s = 0; s < manifest.shards.size(); ++s) {
    out += s == 0 ? "\n" : ",\n";
    out += "{\"file\":";
    detail::append_json_string(out, manifest.shards[s].file);
    out += ",\"bytes\":" + std::to_string(manifest.shards[s].bytes) + "}";
  }
  out += "],\n\"entries\":[";
  for (size_t e = 0; e < manifest.entries.size(); ++e) {
    const CacheEntry& entry = manifest.entries[e];
    const SourceFingerprint& fp = entry.fingerprint;
    out += e == 0 ? "\n" : ",\n";
    out += "{\"key\":";
    detail::append_json_string(out, entry.key);
    out += ",\"shard\":" + std::to_string(entry.shard) + ",\"slot\":" + std::to_string(entry.slot);
    out += ",\"fingerprint\":{\"path\":";
    detail::append_json_string(out, fp.path);
    out += ",\"size\":" + std::to_string(fp.size) +
           ",\"mtime_ns\":" + std::to_string(static_cast<uint64_t>(fp.mtime_ns)) +
           ",\"content_hash\":";
    detail::append_json_string(out, fp.content_hash);
    out += ",\"config\":";
    detail::append_json_string(out, fp.config);
    out += "},\"tensors\":[";
    for (size_t t = 0; t < entry.tensors.size(); ++t) {
      const CacheTensorRecord& tensor = entry.tensors[t];
      if (t > 0) out += ',';
      out += "{\"name\":";
      detail::append_json_string(out, tensor.name);
      out += ",\"dtype\":\"" + std::string(dtype_name(tensor.dtype)) + "\",\"shape\":[";
      for (size_t d = 0; d < tensor.shape.size(); ++d) {
        if (d > 0) out += ',';
        out += std::to_string(tensor.shape[d]);
      }
      out += "],\"offset\":" + std::to_string(tensor.offset) +
             ",\"nbytes\":" + std::to_string(tensor.nbytes);
      if (!tensor.checksum.empty()) {
        out += ",\"checksum\":";
        detail::append_json_string(out, tensor.checksum);
      }
      out += "}";
    }
    out += "]}";
  }
  out += "]}\n";
  return out;
}

CacheManifest read_cache_manifest(const std::string& path) {
  return parse_cache_manifest(detail::read_text_file(path), path);
}

void publish_cache_manifest(const std::string& path, const CacheManifest& manifest) {
  detail::write_file_atomically(path, format_cache_manifest(manifest));
}

std::vector<std::string> drop_unreferenced_shards(CacheManifest& manifest) {
  std::vector<bool> used(manifest.shards.size(), false);
  for (const CacheEntry& entry : manifest.entries) used[entry.shard] = true;
  std::vector<uint32_t> renumber(manifest.shards.size(), 0);
  std::vector<CacheShard> kept;
  std::vector<std::string> dropped;
  for (size_t s = 0; s < manifest.shards.size(); ++s) {
    if (!used[s]) {
      dropped.push_back(std::move(manifest.shards[s].file));
      continue;
    }
    renumber[s] = static_cast<uint32_t>(kept.size());
    kept.push_back(std::move(manifest.shards[s]));
  }
  manifest.shards = std::move(kept);
  for (CacheEntry& entry : manifest.entries) entry.shard = renumber[entry.shard];
  return dropped;
}

std::vector<std::string> merge_cache_manifest(CacheManifest& into, const CacheManifest& from) {
  std::unordered_map<std::string, uint32_t> shard_index;
  for (size_t s = 0; s < into.shards.size(); ++s) {
    shard_index.emplace(into.shards[s].file, static_cast<uint32_t>(s));
  }
  std::vector<uint32_t> mapped(from.shards.size());
  for (size_t s = 0; s < from.shards.size(); ++s) {
    const auto [it, added] =
        shard_index.emplace(from.shards[s].file, static_cast<uint32_t>(into.shards.size()));
    if (added) into.shards.push_back(from.shards[s]);
    mapped[s] = it->second;
  }
  std::unordered_map<std::string, size_t> entry_index;
  for (size_t e = 0; e < into.entries.size(); ++e) entry_index.emplace(into.entries[e].key, e);
  for (const CacheEntry& entry : from.entries) {
    CacheEntry copy = entry;
    copy.shard = mapped[entry.shard];
    const auto it = entry_index.find(entry.key);
    if (it == entry_index.end()) {
      entry_index.emplace(entry.key, into.entries.size());
      into.entries.push_back(std::move(copy));
    } else {
      into.entries[it->second] = std::move(copy);
    }
  }
  return drop_unreferenced_shards(into);
}

}  // namespace leanloader
