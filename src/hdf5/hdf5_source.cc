#include "leanloader/hdf5/hdf5_source.h"

#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "hdf5/hdf5_dataset.h"
#include "leanloader/core/checked_size.h"
#include "leanloader/core/error.h"
#include "leanloader/hdf5/hdf5_library.h"

namespace leanloader {

namespace {

// Paths matching `pattern`, sorted (glob's own order); a pattern without
// wildcards that names a missing file is NotFound.
std::vector<std::string> expand(const std::string& pattern) {
  // A file of that very name is that file, as h5py.File would open it, even
  // when its name has glob characters ("run[1].h5" must not read "run1.h5").
  struct stat st {};
  if (::stat(pattern.c_str(), &st) == 0 && S_ISREG(st.st_mode)) return {pattern};
  glob_t matches{};
  // GLOB_ERR: a directory that cannot be read stops the expansion with an
  // error instead of silently dropping the files it holds.
  const int status = ::glob(pattern.c_str(), GLOB_ERR, nullptr, &matches);
  if (status == GLOB_ABORTED) {
    ::globfree(&matches);
    throw IoError("cannot read a directory while expanding", pattern, errno != 0 ? errno : EIO);
  }
  std::vector<std::string> paths;
  if (status == 0) {
    for (size_t i = 0; i < matches.gl_pathc; ++i) paths.emplace_back(matches.gl_pathv[i]);
  }
  ::globfree(&matches);
  if (paths.empty()) throw IoError("no HDF5 file matches", pattern, ENOENT);
  std::sort(paths.begin(), paths.end());
  return paths;
}

const char* path_name(detail::Hdf5ReadPath path) {
  switch (path) {
    case detail::Hdf5ReadPath::kPread:
      return "pread";
    case detail::Hdf5ReadPath::kChunks:
      return "chunks";
    case detail::Hdf5ReadPath::kMemory:
      return "memory";
    case detail::Hdf5ReadPath::kLibrary:
      return "library";
  }
  return "library";
}

}  // namespace

std::shared_ptr<HDF5Source> HDF5Source::open(std::vector<HDF5Field> fields,
                                             HDF5SourceOptions options) {
  if (fields.empty()) throw InvalidArgument("HDF5Source needs at least one field");
  std::vector<Matched> matched;
  for (HDF5Field& spec : fields) {
    for (const Matched& other : matched) {
      if (other.name == spec.name)
        throw InvalidArgument("HDF5Source: field '" + spec.name + "' given twice");
    }
    std::shared_ptr<const std::vector<int64_t>> index;
    if (spec.index) index = std::make_shared<const std::vector<int64_t>>(std::move(*spec.index));
    matched.push_back({spec.name, spec.files, spec.dataset, expand(spec.files), std::move(index)});
  }
  return open_matched(std::move(matched), options);
}

std::shared_ptr<HDF5Source> HDF5Source::open_matched(std::vector<Matched> matched,
                                                     HDF5SourceOptions options) {
  std::shared_ptr<HDF5Source> source(new HDF5Source());
  source->options_ = options;
  source->owner_pid_ = ::getpid();
  source->cache_ = std::make_unique<detail::ChunkCache>(options.chunk_cache_bytes);
  source->files_ = std::make_shared<detail::Hdf5Files>(options.max_open_files);
  std::string description;
  for (const Matched& spec : matched) {
    Field field;
    field.name = spec.name;
    field.dataset = spec.dataset;
    for (const std::string& path : spec.paths) {
      auto part = std::make_shared<detail::Hdf5Dataset>(path, spec.dataset, source->files_);
      if (!field.parts.empty()) {
        const detail::Hdf5Dataset& head = *field.parts.front();
        if (part->dtype != head.dtype || part->row_shape != head.row_shape) {
          throw InvalidArgument("HDF5Source field '" + spec.name + "': '" + path +
                                "' has rows of " + shape_to_string(part->row_shape) + " " +
                                std::string(dtype_name(part->dtype)) + " but '" + head.path +
                                "' has " + shape_to_string(head.row_shape) + " " +
                                std::string(dtype_name(head.dtype)));
        }
      }
      field.starts.push_back(field.rows);
      field.rows += part->rows;
      field.parts.push_back(std::move(part));
    }
    if (spec.index) {
      const std::vector<int64_t>& index = *spec.index;
      for (size_t i = 0; i < index.size(); ++i) {
        if (index[i] < 0 || index[i] >= field.rows) {
          throw InvalidArgument("HDF5Source field '" + spec.name + "': index[" + std::to_string(i) +
                                "] = " + std::to_string(index[i]) + " is out of range for the " +
                                std::to_string(field.rows) + " rows of dataset '" + spec.dataset +
                                "' in '" + spec.pattern + "'");
        }
      }
      field.index = spec.index;
    }
    const int64_t rows = field.index ? static_cast<int64_t>(field.index->size()) : field.rows;
    if (!source->fields_.empty() && rows != source->rows_) {
      throw InvalidArgument("HDF5Source fields disagree on the number of samples: '" +
                            source->fields_.front().name + "' has " +
                            std::to_string(source->rows_) + ", '" + spec.name + "' has " +
                            std::to_string(rows));
    }
    source->rows_ = rows;
    const detail::Hdf5Dataset& head = *field.parts.front();
    source->specs_.push_back({field.name, head.dtype, head.row_shape});
    const auto bytes = checked_add(source->sample_bytes_, head.row_bytes);
    if (!bytes) throw InvalidArgument("HDF5Source: sample size overflows size_t");
    source->sample_bytes_ = *bytes;
    description += (description.empty() ? "" : ", ") + field.name + ": " + spec.pattern + ":" +
                   spec.dataset + (field.index ? "[index]" : "");
    source->fields_.push_back(std::move(field));
  }
  source->description_ = "HDF5Source(" + description + ")";
  size_t raw = 0;
  size_t decoded = 0;
  size_t library = 0;
  for (const Field& field : source->fields_) {
    for (const auto& part : field.parts) {
      raw = std::max(raw, part->raw_chunk_bytes());
      decoded = std::max(decoded, part->decoded_chunk_bytes());
      library = std::max(library, part->library_chunk_bytes());
    }
  }
  // (a field on each path holds both: each path's buffers stay with the thread)
  const auto both = checked_add(raw, decoded);
  const auto scratch = both ? checked_add(*both, library) : std::nullopt;
  if (!scratch) throw InvalidArgument("HDF5Source: chunk sizes overflow size_t");
  source->scratch_bytes_ = *scratch;
  source->matched_ = std::move(matched);
  return source;
}

HDF5Source::~HDF5Source() = default;

bool HDF5Source::files_unchanged(bool or_throw) const {
  for (const Field& field : fields_) {
    for (const auto& part : field.parts) {
      const bool fast_path = part->read_path == detail::Hdf5ReadPath::kPread ||
                             part->read_path == detail::Hdf5ReadPath::kChunks;
      // The data file an external link reaches, read on the fast paths.
      const bool linked = fast_path && part->data_path != part->open_path;
      if (part->identity.unchanged(part->open_path) &&
          (!linked || files_->data.unchanged(part->data_key))) {
        continue;
      }
      if (or_throw) {
        part->identity.check_unchanged(part->open_path);
        if (linked) files_->data.check_unchanged(part->data_key);
      }
      return false;
    }
  }
  return true;
}

std::shared_ptr<const Source> HDF5Source::snapshot() const {
  std::lock_guard lock(snapshot_mutex_);
  const HDF5Source& now = current_ ? *current_ : *this;
  if (now.files_unchanged()) return current_;
  // Opened before it is published: a file that no longer opens throws and
  // leaves the current one in place (for its readers; the next pass tries
  // again).
  std::shared_ptr<const HDF5Source> fresh = open_matched(matched_, options_);
  // Nothing reads this source's decoded chunks again once a loader has
  // moved on (a loader keeping this snapshot stops at its next pass).
  if (!current_) cache_->clear();
  current_ = std::move(fresh);
  return current_;
}

void HDF5Source::check_unchanged() const { files_unchanged(/*or_throw=*/true); }

void HDF5Source::pass_ended() const noexcept { files_->library.close_all(); }

void HDF5Source::read_sample(int64_t index, SampleWriter& writer) const {
  if (::getpid() != owner_pid_) {
    throw Error("this HDF5Source was opened in process " + std::to_string(owner_pid_) +
                " and cannot be read in a forked child (pid " + std::to_string(::getpid()) +
                "): the HDF5 library's state and lock were copied mid-flight; open the source "
                "in the child, or start workers with spawn");
  }
  if (index < 0 || index >= rows_) {
    throw InvalidArgument("index " + std::to_string(index) + " out of range for " +
                          std::to_string(rows_) + " samples");
  }
  for (size_t f = 0; f < fields_.size(); ++f) read_field_row(f, index, writer);
}

void HDF5Source::read_field_row(size_t f, int64_t index, SampleWriter& writer) const {
  const Field& field = fields_[f];
  const int64_t row = field.index ? (*field.index)[static_cast<size_t>(index)] : index;
  const size_t part =
      static_cast<size_t>(std::upper_bound(field.starts.begin(), field.starts.end(), row) -
                          field.starts.begin()) -
      1;
  const detail::Hdf5Dataset& dataset = *field.parts[part];
  const std::span<std::byte> dst = writer.field_buffer(f, dataset.row_shape);
  dataset.read_row(row - field.starts[part], dst, cache_.get());
}

std::string HDF5Source::sample_location(int64_t index) const {
  if (index < 0 || index >= rows_) return "sample " + std::to_string(index) + " (out of range)";
  std::string out;
  for (const Field& field : fields_) {
    const int64_t row = field.index ? (*field.index)[static_cast<size_t>(index)] : index;
    const size_t part =
        static_cast<size_t>(std::upper_bound(field.starts.begin(), field.starts.end(), row) -
                            field.starts.begin()) -
        1;
    out += (out.empty() ? "" : "; ") + field.parts[part]->where(row - field.starts[part]);
  }
  return out;
}

std::vector<std::string> HDF5Source::files(size_t field) const {
  std::vector<std::string> out;
  for (const auto& part : fields_.at(field).parts) out.push_back(part->path);
  return out;
}

std::vector<std::string> HDF5Source::layout(size_t field) const {
  std::vector<std::string> out;
  for (const auto& part : fields_.at(field).parts) {
    std::string entry = path_name(part->read_path);
    if (part->read_path == detail::Hdf5ReadPath::kLibrary) entry += ": " + part->library_reason;
    if (part->read_path != detail::Hdf5ReadPath::kLibrary && part->data_path != part->path) {
      entry += " (data in '" + part->data_path + "')";
    }
    out.push_back(std::move(entry));
  }
  return out;
}

size_t HDF5Source::chunk_cache_bytes() const { return cache_->bytes(); }

bool HDF5Source::library_threadsafe() { return hdf5_library_info().threadsafe; }

size_t HDF5Source::open_file_budget() const noexcept { return files_->data.budget(); }

size_t HDF5Source::open_file_count() const { return files_->data.open_count(); }

}  // namespace leanloader
