#include "leanloader/cache/tensor_cache.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <set>

#include "cache/cache_directory.h"
#include "io/file_io.h"
#include "io/resident_copy.h"
#include "leanloader/core/error.h"
#include "leanloader/io/content_hash.h"

namespace leanloader {

namespace {

std::string describe_tensors(const std::vector<CacheTensorRecord>& tensors) {
  std::string out;
  for (const CacheTensorRecord& t : tensors) {
    out += (out.empty() ? "" : ", ") + t.name + ":" + std::string(dtype_name(t.dtype));
  }
  return "{" + out + "}";
}

std::string describe_fields(const std::vector<FieldSpec>& fields) {
  std::string out;
  for (const FieldSpec& f : fields) {
    out += (out.empty() ? "" : ", ") + f.name + ":" + std::string(dtype_name(f.dtype));
  }
  return "{" + out + "}";
}

std::string file_stem(const std::string& name) {
  static constexpr std::string_view kSuffix = ".safetensors";
  return detail::ends_with(name, kSuffix) ? name.substr(0, name.size() - kSuffix.size()) : name;
}

// Orders `tensors` as `fields` (same names and dtypes in any order); false
// when they are not the same set.
bool order_like_fields(std::vector<CacheTensorRecord>& tensors,
                       const std::vector<FieldSpec>& fields) {
  if (tensors.size() != fields.size()) return false;
  std::vector<CacheTensorRecord> ordered;
  ordered.reserve(fields.size());
  for (const FieldSpec& field : fields) {
    const auto it = std::find_if(tensors.begin(), tensors.end(),
                                 [&](const CacheTensorRecord& t) { return t.name == field.name; });
    if (it == tensors.end() || it->dtype != field.dtype) return false;
    ordered.push_back(std::move(*it));
  }
  tensors = std::move(ordered);
  return true;
}

// The header of an open file, read with preads (8 bytes, then 8 + N).
SafetensorsHeader read_header(const detail::File& file) {
  std::vector<std::byte> bytes(std::min<size_t>(file.size(), 8));
  file.read_exact(0, bytes);
  if (bytes.size() == 8) {
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i)
      n = (n << 8) | static_cast<uint64_t>(bytes[static_cast<size_t>(i)]);
    if (n <= kSafetensorsMaxHeaderSize && 8 + n <= file.size()) {
      bytes.resize(8 + n);
      file.read_exact(8, std::span(bytes).subspan(8));
    }
  }
  return parse_safetensors_header(bytes, file.size(), file.path());
}

std::vector<CacheTensorRecord> records_of(const SafetensorsHeader& header) {
  std::vector<CacheTensorRecord> records;
  for (const SafetensorsEntry& entry : header.tensors) {
    records.push_back({entry.name, entry.dtype, entry.shape, header.data_offset + entry.begin,
                       entry.end - entry.begin, ""});
  }
  return records;
}

}  // namespace

// One consistent view of the cache: the manifest (or folder) as read at one
// moment, and the shards mapped from it; the snapshot a Loader reads (a
// Source of its own). Immutable except for the lazily filled shard table,
// which its own mutex guards. Holds the directory's shared lock, so the
// shards it may still map are never cleaned up by another process.
class TensorCache::State final : public Source {
 public:
  int64_t size() const override { return static_cast<int64_t>(manifest.entries.size()); }
  const std::vector<FieldSpec>& fields() const override { return field_list; }
  void read_sample(int64_t index, SampleWriter& writer) const override;
  std::string describe() const override {
    return std::string(layout == Layout::kSharded ? "TensorCache(" : "TensorCache(per-sample ") +
           path + ")";
  }
  std::string sample_location(int64_t index) const override;
  size_t estimated_sample_bytes() const override { return sample_bytes; }
  uint64_t storage_reads() const override { return storage_read_count.load(); }
  void will_need(int64_t index) const noexcept override;
  // Whether the listing differs from what this state read (or, where there
  // was none, has appeared since).
  bool changed_on_disk() const {
    if (listing) return !listing->unchanged(listing_path);
    struct stat st {};
    return ::stat(listing_path.c_str(), &st) == 0;
  }

  std::string path;  // as the user gave it
  // What a writer elsewhere changes: manifest.json (replaced by a rename),
  // the per-sample folder (its modification time), the single file; as
  // stat'ed before it was read.
  std::string listing_path;
  std::optional<detail::FileIdentity> listing;
  std::shared_ptr<const detail::CacheLock> lock;
  Layout layout = Layout::kSharded;
  std::string directory;
  CacheManifest manifest;
  std::vector<FieldSpec> field_list;
  std::vector<std::string> entry_errors;  // per-sample layout: why a file failed ("" = fine)
  std::vector<std::vector<size_t>> shard_entries;  // shard -> entry indices
  std::unordered_map<std::string, int64_t> key_index;
  size_t sample_bytes = 0;

  mutable std::mutex mutex;
  mutable std::vector<std::shared_ptr<SafetensorsFile>> shards;
  // A descriptor per mapped shard, for pread gathers (see read_sample).
  mutable std::vector<std::unique_ptr<detail::File>> files;
  mutable std::vector<std::string> shard_errors;
  mutable std::unique_ptr<std::atomic<const SafetensorsFile*>[]> published;
  // Gathers that had to wait for storage (see Source::storage_reads).
  mutable std::atomic<uint64_t> storage_read_count{0};

  std::string shard_path(uint32_t shard) const {
    if (shard >= manifest.shards.size()) {
      throw InvalidArgument("shard " + std::to_string(shard) + " out of range");
    }
    return detail::join_path(directory, manifest.shards[shard].file);
  }
  const CacheEntry& entry_at(int64_t index) const {
    if (index < 0 || static_cast<size_t>(index) >= manifest.entries.size()) {
      throw InvalidArgument("index " + std::to_string(index) + " out of range for " +
                            std::to_string(manifest.entries.size()) + " entries");
    }
    return manifest.entries[static_cast<size_t>(index)];
  }
  void derive_fields(const std::string& manifest_path);
  void index_shards();
  void load_per_sample(std::vector<std::string> names);
  const SafetensorsFile& mapped_shard(uint32_t shard) const;
  void check_shard(const SafetensorsFile& file, uint32_t shard) const;
  void read_per_sample(int64_t index, SampleWriter* writer,
                       std::vector<std::pair<std::string, Tensor>>* views) const;
};

TensorCache::~TensorCache() = default;

std::shared_ptr<TensorCache> TensorCache::open(const std::string& path, bool cleanup) {
  return std::make_shared<TensorCache>(path, cleanup);
}

// A relative path is made absolute at open: shards are mapped lazily and a
// later os.chdir() must not make them another directory's files.
TensorCache::TensorCache(const std::string& path, bool cleanup)
    : path_(detail::absolute_path_as_named(path)) {
  state_ = load_state(cleanup);
  field_lists_.push_back(std::make_shared<const std::vector<FieldSpec>>(state_->field_list));
}

void TensorCache::reload() {
  // One reload at a time (snapshot() reloads too, from any loader's thread).
  std::lock_guard<std::mutex> reloading(reload_mutex_);
  std::shared_ptr<const State> next = load_state(false);
  std::lock_guard<std::mutex> guard(state_mutex_);
  const std::vector<FieldSpec>& fields = *field_lists_.back();
  if (!state_->manifest.entries.empty() && !next->manifest.entries.empty()) {
    bool same = next->field_list.size() == fields.size();
    for (size_t f = 0; same && f < fields.size(); ++f) {
      same = next->field_list[f].name == fields[f].name &&
             next->field_list[f].dtype == fields[f].dtype;
    }
    if (!same) {
      throw InvalidArgument("'" + path_ +
                            "': the cache's tensor names or dtypes changed; open it again");
    }
  }
  // Names and dtypes are the same; shapes may have become variable. The old
  // list stays alive: fields() references handed out before remain valid.
  bool changed = next->field_list.size() != fields.size();
  for (size_t f = 0; !changed && f < fields.size(); ++f)
    changed = fields[f].shape != next->field_list[f].shape;
  if (changed && !next->field_list.empty()) {
    field_lists_.push_back(std::make_shared<const std::vector<FieldSpec>>(next->field_list));
  }
  state_ = std::move(next);
}

std::shared_ptr<const TensorCache::State> TensorCache::state() const {
  std::lock_guard<std::mutex> guard(state_mutex_);
  return state_;
}

std::shared_ptr<const Source> TensorCache::snapshot() const {
  std::shared_ptr<const State> current = state();
  // Another process (or another TensorCache object) may have written the
  // cache since: one stat decides, and the reload is the one build() makes.
  if (!current->changed_on_disk()) return current;
  // snapshot() is const to its callers (a Source's view of itself now);
  // following the directory publishes a new state as reload() does.
  const_cast<TensorCache*>(this)->reload();
  return state();
}

const std::vector<FieldSpec>& TensorCache::fields() const {
  std::lock_guard<std::mutex> guard(state_mutex_);
  return *field_lists_.back();
}

std::shared_ptr<const TensorCache::State> TensorCache::load_state(bool cleanup) {
  struct stat st {};
  if (::stat(path_.c_str(), &st) != 0) throw IoError("cannot open cache", path_, errno);
  auto state = std::make_shared<State>();
  state->path = path_;
  // Stat'ed before reading: a write after this is seen by the next check.
  state->listing_path = path_;
  state->listing = detail::FileIdentity::of(st);
  if (S_ISREG(st.st_mode)) {
    const size_t slash = path_.find_last_of('/');
    state->directory =
        slash == std::string::npos ? "." : path_.substr(0, std::max<size_t>(slash, 1));
    state->load_per_sample({slash == std::string::npos ? path_ : path_.substr(slash + 1)});
    return state;
  }
  if (!S_ISDIR(st.st_mode)) {
    throw InvalidArgument("'" + path_ + "' is neither a cache directory nor a .safetensors file");
  }
  state->directory = path_;
  const std::string manifest_path = detail::join_path(path_, std::string(kCacheManifestName));
  if (::stat(manifest_path.c_str(), &st) != 0) {
    std::vector<std::string> files;
    for (const std::string& name : detail::list_files(path_)) {
      // Hidden files are not samples (as `glob("dir/*.safetensors")` has it):
      // "._x.safetensors" is the AppleDouble file of a macOS copy.
      if (name.front() != '.' && detail::ends_with(name, ".safetensors") &&
          !detail::is_shard_name(name)) {
        files.push_back(name);
      }
    }
    if (!files.empty()) {
      state->load_per_sample(std::move(files));
      return state;
    }
  }
  state->layout = Layout::kSharded;
  // The lock is taken once (load_state runs in the constructor, then under
  // reload(), which one caller at a time may run) and shared by every
  // snapshot: the directory's shared lock stays held while any snapshot
  // lives.
  if (!lock_) {
    lock_ = std::make_shared<const detail::CacheLock>(
        detail::CacheLock::open_shared(path_, cleanup, &removed_));
  }
  state->lock = lock_;
  state->listing_path = manifest_path;
  state->listing.reset();
  if (::stat(manifest_path.c_str(), &st) == 0) {
    state->listing = detail::FileIdentity::of(st);
    state->manifest = read_cache_manifest(manifest_path);
  }
  state->derive_fields(manifest_path);
  state->index_shards();
  return state;
}

void TensorCache::State::index_shards() {
  shard_entries.assign(manifest.shards.size(), {});
  for (size_t e = 0; e < manifest.entries.size(); ++e) {
    shard_entries[manifest.entries[e].shard].push_back(e);
  }
  shards.assign(manifest.shards.size(), nullptr);
  files.resize(manifest.shards.size());
  shard_errors.assign(manifest.shards.size(), "");
  published = std::make_unique<std::atomic<const SafetensorsFile*>[]>(manifest.shards.size());
  for (size_t s = 0; s < manifest.shards.size(); ++s) published[s].store(nullptr);
}

void TensorCache::State::derive_fields(const std::string& manifest_path) {
  std::vector<CacheEntry>& entries = manifest.entries;
  key_index.reserve(entries.size());
  for (size_t e = 0; e < entries.size(); ++e) key_index.emplace(entries[e].key, e);
  if (entries.empty()) return;
  for (const CacheTensorRecord& t : entries.front().tensors) {
    field_list.push_back({t.name, t.dtype, t.shape});
  }
  size_t total = 0;
  for (size_t e = 0; e < entries.size(); ++e) {
    CacheEntry& entry = entries[e];
    if (!order_like_fields(entry.tensors, field_list)) {
      throw FormatError("'" + manifest_path + "': entry " + std::to_string(e) + " (key '" +
                        entry.key + "') has tensors " + describe_tensors(entry.tensors) +
                        " but the first entry has " + describe_fields(field_list) +
                        " (every entry needs the same names and dtypes)");
    }
    for (size_t f = 0; f < field_list.size(); ++f) {
      if (field_list[f].shape && *field_list[f].shape != entry.tensors[f].shape)
        field_list[f].shape.reset();
      total += entry.tensors[f].nbytes;
    }
  }
  sample_bytes = (total + entries.size() - 1) / entries.size();
}

void TensorCache::State::load_per_sample(std::vector<std::string> names) {
  layout = Layout::kPerSampleFiles;
  std::sort(names.begin(), names.end());
  entry_errors.assign(names.size(), "");
  size_t total = 0, good = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string file_path = detail::join_path(directory, names[i]);
    CacheEntry entry;
    entry.key = file_stem(names[i]);
    entry.shard = static_cast<uint32_t>(i);
    entry.fingerprint.path = file_path;
    CacheShard shard{names[i], 0};
    try {
      const detail::File file(file_path);
      shard.bytes = file.size();
      entry.tensors = records_of(read_header(file));
      if (field_list.empty()) {
        for (const CacheTensorRecord& t : entry.tensors)
          field_list.push_back({t.name, t.dtype, t.shape});
      }
      if (!order_like_fields(entry.tensors, field_list)) {
        entry_errors[i] = "'" + file_path + "': has tensors " + describe_tensors(entry.tensors) +
                          " but the folder's first valid file has " + describe_fields(field_list);
        entry.tensors.clear();
      } else {
        for (size_t f = 0; f < field_list.size(); ++f) {
          if (field_list[f].shape && *field_list[f].shape != entry.tensors[f].shape)
            field_list[f].shape.reset();
          total += entry.tensors[f].nbytes;
        }
        ++good;
      }
    } catch (const Error& error) {
      // A bad file is a bad sample (the loader raises or skips it), not an
      // unusable cache.
      entry_errors[i] = error.what();
      entry.tensors.clear();
    }
    manifest.shards.push_back(std::move(shard));
    manifest.entries.push_back(std::move(entry));
  }
  for (size_t e = 0; e < manifest.entries.size(); ++e)
    key_index.emplace(manifest.entries[e].key, e);
  sample_bytes = good == 0 ? 0 : (total + good - 1) / good;
}

int64_t TensorCache::size() const { return state()->size(); }
size_t TensorCache::estimated_sample_bytes() const { return state()->sample_bytes; }
TensorCache::Layout TensorCache::layout() const { return state()->layout; }
std::shared_ptr<const CacheManifest> TensorCache::manifest() const {
  std::shared_ptr<const State> s = state();
  return std::shared_ptr<const CacheManifest>(s, &s->manifest);
}

std::string TensorCache::describe() const { return state()->describe(); }

std::string TensorCache::shard_path(uint32_t shard) const { return state()->shard_path(shard); }

std::string TensorCache::sample_location(int64_t index) const {
  return state()->sample_location(index);
}

std::string TensorCache::State::sample_location(int64_t index) const {
  if (index < 0 || static_cast<size_t>(index) >= manifest.entries.size()) {
    return "index " + std::to_string(index);
  }
  const CacheEntry& entry = entry_at(index);
  if (layout == Layout::kPerSampleFiles) return shard_path(entry.shard);
  return shard_path(entry.shard) + " key " + entry.key;
}

std::string TensorCache::key(int64_t index) const { return state()->entry_at(index).key; }

std::optional<int64_t> TensorCache::find(const std::string& key) const {
  const std::shared_ptr<const State> s = state();
  const auto it = s->key_index.find(key);
  if (it == s->key_index.end()) return std::nullopt;
  return it->second;
}

void TensorCache::State::check_shard(const SafetensorsFile& file, uint32_t shard) const {
  const CacheShard& expected = manifest.shards[shard];
  if (file.mapping()->size() != expected.bytes) {
    throw FormatError("'" + file.path() + "': " + std::to_string(file.mapping()->size()) +
                      " bytes, but the manifest says " + std::to_string(expected.bytes) +
                      " (the shard was modified after it was published)");
  }
  const uint64_t data_offset = file.header().data_offset;
  for (const size_t e : shard_entries[shard]) {
    const CacheEntry& entry = manifest.entries[e];
    for (const CacheTensorRecord& record : entry.tensors) {
      const std::string name = cache_shard_tensor_name(entry.slot, record.name);
      const std::optional<size_t> index = file.find(name);
      if (!index) {
        throw FormatError("'" + file.path() + "': key '" + entry.key + "': tensor '" + name +
                          "' is missing from the shard");
      }
      const SafetensorsEntry& got = file.header().tensors[*index];
      if (got.dtype != record.dtype || got.shape != record.shape ||
          data_offset + got.begin != record.offset) {
        throw FormatError(
            "'" + file.path() + "': key '" + entry.key + "': tensor '" + name + "' is " +
            std::string(dtype_name(got.dtype)) + " " + shape_to_string(got.shape) + " at byte " +
            std::to_string(data_offset + got.begin) + ", the manifest says " +
            std::string(dtype_name(record.dtype)) + " " + shape_to_string(record.shape) +
            " at byte " + std::to_string(record.offset));
      }
    }
  }
}

const SafetensorsFile& TensorCache::State::mapped_shard(uint32_t shard) const {
  if (const SafetensorsFile* file = published[shard].load(std::memory_order_acquire)) {
    return *file;
  }
  std::lock_guard<std::mutex> guard(mutex);
  if (const SafetensorsFile* file = published[shard].load(std::memory_order_relaxed)) {
    return *file;
  }
  if (!shard_errors[shard].empty()) throw FormatError(shard_errors[shard]);
  std::shared_ptr<SafetensorsFile> file;
  try {
    file = SafetensorsFile::open(shard_path(shard));
    check_shard(*file, shard);
  } catch (const FormatError& error) {
    shard_errors[shard] = error.what();
    throw;
  }
  files[shard] = std::make_unique<detail::File>(file->path());
  shards[shard] = file;
  published[shard].store(file.get(), std::memory_order_release);
  return *file;
}

void TensorCache::State::read_per_sample(int64_t index, SampleWriter* writer,
                                         std::vector<std::pair<std::string, Tensor>>* views) const {
  const auto i = static_cast<size_t>(index);
  if (!entry_errors[i].empty()) throw FormatError(entry_errors[i]);
  const std::string file_path = shard_path(manifest.entries[i].shard);
  if (views != nullptr) {
    const std::shared_ptr<SafetensorsFile> file = SafetensorsFile::open(file_path);
    for (const FieldSpec& field : field_list) {
      const std::optional<size_t> t = file->find(field.name);
      if (!t || file->header().tensors[*t].dtype != field.dtype) {
        throw FormatError("'" + file_path + "': has no " + std::string(dtype_name(field.dtype)) +
                          " tensor '" + field.name + "' (it changed since the cache was opened)");
      }
      views->emplace_back(field.name, file->tensor(*t));
    }
    return;
  }
  // Header again, from the file as it is now: it may have been rewritten.
  const detail::File file(file_path);
  std::vector<CacheTensorRecord> records = records_of(read_header(file));
  if (!order_like_fields(records, field_list)) {
    throw FormatError("'" + file_path + "': has tensors " + describe_tensors(records) +
                      " but the cache's fields are " + describe_fields(field_list));
  }
  for (size_t f = 0; f < field_list.size(); ++f) {
    const std::span<std::byte> dst = writer->field_buffer(f, records[f].shape);
    file.read_exact(records[f].offset, dst.first(records[f].nbytes));
  }
}

void TensorCache::read_sample(int64_t index, SampleWriter& writer) const {
  state()->read_sample(index, writer);
}

uint64_t TensorCache::storage_reads() const { return state()->storage_reads(); }

void TensorCache::will_need(int64_t index) const noexcept { state()->will_need(index); }

void TensorCache::State::read_sample(int64_t index, SampleWriter& writer) const {
  const CacheEntry& entry = entry_at(index);
  if (layout == Layout::kPerSampleFiles) {
    read_per_sample(index, &writer, nullptr);
    return;
  }
  // The gather copy is a pread from the page cache straight into the slot,
  // not a memcpy from the mapping: measured on the `latents` bench data
  // (2.5 MiB samples), both run at the same speed once the pages are mapped,
  // but pread skips the page-table set-up of a process's first pass over a
  // shard (page faults), which made first epochs 1.5-2x slower. The mapping
  // is still what entry() views and what validated the shard.
  // A batch that wants streaming stores (several MiB) copies tensors that
  // are in memory from the mapping with those instead (io/resident_copy.h):
  // the kernel's copy writes through the cache.
  const MappedFile& mapping = *mapped_shard(entry.shard).mapping();
  const detail::File& file = *files[entry.shard];
  const detail::Stores stores =
      writer.prefers_streaming_stores() ? detail::Stores::kStreaming : detail::Stores::kCached;
  for (size_t f = 0; f < field_list.size(); ++f) {
    const CacheTensorRecord& record = entry.tensors[f];
    const std::span<std::byte> dst = writer.field_buffer(f, record.shape);
    if (record.nbytes > 0 && !detail::read_noting_misses(file, mapping, record.offset,
                                                         dst.first(record.nbytes), stores)) {
      storage_read_count.fetch_add(1, std::memory_order_relaxed);
    }
  }
}

void TensorCache::State::will_need(int64_t index) const noexcept {
  if (layout != Layout::kSharded || index < 0 || index >= size()) return;
  const CacheEntry& entry = manifest.entries[static_cast<size_t>(index)];
  // Only shards already open: opening one is not a hint's work (its first
  // read opens it). files[shard] is set before the shard is published.
  if (published[entry.shard].load(std::memory_order_acquire) == nullptr) return;
  const detail::File& file = *files[entry.shard];
  for (const CacheTensorRecord& record : entry.tensors) {
    if (record.nbytes > 0) file.will_need(record.offset, record.nbytes);
  }
}

std::vector<std::pair<std::string, Tensor>> TensorCache::entry(int64_t index) const {
  const std::shared_ptr<const State> s = state();
  const CacheEntry& entry = s->entry_at(index);
  std::vector<std::pair<std::string, Tensor>> views;
  if (s->layout == Layout::kPerSampleFiles) {
    s->read_per_sample(index, nullptr, &views);
    return views;
  }
  const SafetensorsFile& file = s->mapped_shard(entry.shard);
  for (const CacheTensorRecord& record : entry.tensors) {
    views.emplace_back(record.name, file.tensor(cache_shard_tensor_name(entry.slot, record.name)));
  }
  return views;
}

std::vector<CacheProblem> TensorCache::verify(bool check_sources, bool check_data) const {
  const std::shared_ptr<const State> s = state();
  const CacheManifest& manifest = s->manifest;
  const std::vector<FieldSpec>& fields = s->field_list;
  const std::string& directory = s->directory;
  auto shard_path = [&](uint32_t shard) { return s->shard_path(shard); };
  std::vector<CacheProblem> problems;
  if (s->layout == Layout::kPerSampleFiles) {
    for (size_t i = 0; i < manifest.entries.size(); ++i) {
      const std::string file_path = shard_path(manifest.entries[i].shard);
      if (!s->entry_errors[i].empty()) {
        problems.push_back({"invalid", file_path, s->entry_errors[i]});
        continue;
      }
      try {
        const detail::File file(file_path);
        std::vector<CacheTensorRecord> records = records_of(read_header(file));
        if (!order_like_fields(records, fields)) {
          problems.push_back({"invalid", file_path,
                              "has tensors " + describe_tensors(records) +
                                  " but the cache's fields are " + describe_fields(fields)});
        }
      } catch (const Error& error) {
        problems.push_back({"invalid", file_path, error.what()});
      }
    }
    return problems;
  }

  std::set<std::string> referenced;
  for (const CacheShard& shard : manifest.shards) referenced.insert(shard.file);
  try {
    const std::vector<std::string> files = detail::list_files(directory);
    const std::set<std::string> names(files.begin(), files.end());
    for (const std::string& name : files) {
      const std::string file_path = detail::join_path(directory, name);
      if (detail::is_cache_temp_name(name)) {
        problems.push_back({"partial", file_path,
                            "temporary file of an interrupted write (removed by the next open "
                            "when no other process has the cache open)"});
      } else if (detail::is_shard_name(name) && !referenced.contains(name) &&
                 names.contains(detail::discardable_marker_name(name))) {
        problems.push_back({"garbage", file_path,
                            "shard not referenced by the manifest (an interrupted write, or "
                            "every entry superseded): invisible to readers, removed by the "
                            "next open that has the cache to itself"});
      } else if (detail::is_shard_name(name) && !referenced.contains(name)) {
        problems.push_back({"unreferenced", file_path,
                            "shard that no manifest references and that no writer of this "
                            "directory left behind (an incomplete copy of a cache? copy its "
                            "manifest.json too); invisible to readers and kept: delete it by "
                            "hand if it is not wanted"});
      } else if (detail::is_rank_manifest_name(name)) {
        problems.push_back({"partial", file_path,
                            "unmerged manifest of a distributed build rank; the next build "
                            "merges it"});
      }
    }
  } catch (const Error& error) {
    problems.push_back({"invalid", directory, error.what()});
  }

  for (uint32_t shard = 0; shard < manifest.shards.size(); ++shard) {
    try {
      s->mapped_shard(shard);
    } catch (const Error& error) {
      std::string keys;
      for (const size_t e : s->shard_entries[shard]) {
        if (keys.size() > 200) {
          keys += ", ...";
          break;
        }
        keys += (keys.empty() ? "'" : ", '") + manifest.entries[e].key + "'";
      }
      problems.push_back({"invalid", shard_path(shard),
                          std::string(error.what()) + " [" +
                              std::to_string(s->shard_entries[shard].size()) +
                              " entries unreadable: " + keys + "]"});
    }
  }

  if (check_data) {
    for (const CacheEntry& entry : manifest.entries) {
      const Storage* mapping = nullptr;
      try {
        mapping = s->mapped_shard(entry.shard).mapping().get();
      } catch (const Error&) {
        continue;  // the shard's problem is reported above
      }
      for (const CacheTensorRecord& tensor : entry.tensors) {
        // (offset + nbytes within the mapping: checked when it was mapped)
        if (tensor.checksum.empty()) continue;
        const std::string now = xxh64_text(xxh64({mapping->data() + tensor.offset, tensor.nbytes}));
        if (now == tensor.checksum) continue;
        problems.push_back({"corrupt", shard_path(entry.shard) + " key " + entry.key,
                            "tensor '" + tensor.name + "': its bytes hash to " + now +
                                ", not to the " + tensor.checksum +
                                " written with them (the shard changed on disk since): "
                                "rebuild the cache"});
      }
    }
  }

  if (check_sources) {
    for (const CacheEntry& entry : manifest.entries) {
      const SourceFingerprint& stored = entry.fingerprint;
      if (stored.path.empty()) continue;
      const std::string where = shard_path(entry.shard) + " key " + entry.key;
      try {
        const SourceFingerprint now =
            fingerprint_file(stored.path, !stored.content_hash.empty(), stored.config);
        if (!fingerprint_matches(stored, now)) {
          std::string what = "source '" + stored.path + "' changed since the entry was built:";
          if (now.size != stored.size) {
            what += " size " + std::to_string(stored.size) + " -> " + std::to_string(now.size);
          }
          if (now.mtime_ns != stored.mtime_ns) {
            what += " mtime_ns " + std::to_string(stored.mtime_ns) + " -> " +
                    std::to_string(now.mtime_ns);
          }
          if (now.content_hash != stored.content_hash) {
            what += " content " + stored.content_hash + " -> " + now.content_hash;
          }
          problems.push_back({"stale", where, what});
        }
      } catch (const Error& error) {
        problems.push_back({"stale", where, "source is gone: " + std::string(error.what())});
      }
    }
  }
  return problems;
}

}  // namespace leanloader
