#include "leanloader/sources/npy_source.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "io/file_io.h"
#include "io/guarded_copy.h"
#include "io/read_around.h"
#include "io/resident_copy.h"
#include "leanloader/core/checked_size.h"
#include "leanloader/core/error.h"
#include "leanloader/memory/memory_monitor.h"

namespace leanloader {

namespace {

// Memory available now; 0 (no reading around) when it cannot be read.
uint64_t available_memory_or_zero() noexcept {
  try {
    return available_memory_bytes();
  } catch (...) {
    return 0;
  }
}

// C-order rows up to this size are copied from a mapping of the file: a
// pread's system call and page-cache lookup cost about as much as copying
// 4 KiB (random 4 KiB rows, 2 threads, page cache: 6.3 GB/s by pread, 14-16
// GB/s from the mapping; 64 KiB: 14.6 vs 17.3-17.8). Larger rows are pread,
// whose single request per row suits data that is not in the page cache,
// unless they are in memory and go into a batch that wants streaming stores:
// then they are copied from the mapping with those (io/resident_copy.h).
constexpr size_t kMappedRowBytes = size_t{64} << 10;

// The bytes of the array a header describes, checked: a shape whose
// numel x itemsize does not fit is a FormatError naming the file.
size_t data_bytes(const NpyHeader& header, const std::string& path) {
  // As numpy, the non-zero dimensions must fit even where another is 0: the
  // strides are products of them, and an empty array's strides are computed too.
  Shape extents = header.shape;
  for (int64_t& dim : extents) dim = std::max<int64_t>(dim, 1);
  const std::optional<size_t> bytes = checked_nbytes(header.shape, header.dtype);
  if (!bytes || !checked_nbytes(extents, header.dtype)) {
    throw FormatError("'" + path + "': the header describes " + shape_to_string(header.shape) +
                      " " + std::string(dtype_name(header.dtype)) +
                      ", whose size in bytes overflows the address space");
  }
  return *bytes;
}

// Element strides of an array stored in Fortran order (first index fastest).
// Bounded by the array's checked element count (data_bytes).
Shape fortran_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t stride = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    strides[i] = stride;
    stride *= std::max<int64_t>(shape[i], 1);
  }
  return strides;
}

// Throws FormatError unless the header's data fits inside a file of `file_size`.
void check_data_fits(const NpyHeader& header, size_t bytes, size_t file_size,
                     const std::string& path) {
  if (!range_fits(header.data_offset, bytes, file_size)) {
    throw FormatError("'" + path + "': truncated .npy file: the header describes " +
                      shape_to_string(header.shape) + " " + std::string(dtype_name(header.dtype)) +
                      " (" + std::to_string(bytes) + " bytes after a " +
                      std::to_string(header.data_offset) + "-byte header) but the file has " +
                      std::to_string(file_size) + " bytes");
  }
}

}  // namespace

std::shared_ptr<NpySource> NpySource::from_arrays(
    const std::vector<std::pair<std::string, std::string>>& fields) {
  if (fields.empty()) throw InvalidArgument("NpySource needs at least one .npy file");
  std::shared_ptr<NpySource> source(new NpySource());
  source->rows_ = -1;
  std::string paths;
  for (const auto& [name, path] : fields) {
    MappedArray array;
    array.path = path;
    array.reader = std::make_shared<detail::File>(path);
    array.header = parse_npy_header(array.reader->read_prefix(kNpyMaxHeaderBytes), path);
    const NpyHeader& header = array.header;
    // Every size below (strides, row bytes) is at most this checked total.
    const size_t total_bytes = data_bytes(header, path);
    check_data_fits(header, total_bytes, array.reader->size(), path);
    if (header.shape.empty()) {
      throw InvalidArgument("'" + path + "' holds a scalar; NpySource needs rows (dimension 0)");
    }
    const Shape strides =
        header.fortran_order ? fortran_strides(header.shape) : contiguous_strides(header.shape);
    array.row_shape.assign(header.shape.begin() + 1, header.shape.end());
    array.row_strides.assign(strides.begin() + 1, strides.end());
    array.row_step = static_cast<size_t>(strides[0]) * dtype_size(header.dtype);
    array.pread_rows = !header.fortran_order && array.row_step > kMappedRowBytes;
    if (total_bytes > 0) array.mapping = MappedFile::open(path);
    if (!header.fortran_order && total_bytes > 0) {
      array.read_around = detail::ReadAround::for_rows(array.reader, header.data_offset,
                                                       header.data_offset + total_bytes,
                                                       array.row_step, available_memory_or_zero());
    }
    if (source->rows_ >= 0 && header.shape[0] != source->rows_) {
      throw InvalidArgument("NpySource files disagree on the number of samples: '" +
                            fields.front().second + "' has " + std::to_string(source->rows_) +
                            " rows, '" + path + "' has " + std::to_string(header.shape[0]));
    }
    source->rows_ = header.shape[0];
    // A row is part of the checked total, so its size cannot overflow, nor can
    // the sum over fields: each is bounded by its file.
    source->sample_bytes_ += *checked_nbytes(array.row_shape, header.dtype);
    source->specs_.push_back({name, header.dtype, array.row_shape});
    source->arrays_.push_back(std::move(array));
    paths += (paths.empty() ? "" : ", ") + path;
  }
  source->description_ = "NpySource(" + paths + ")";
  return source;
}

std::shared_ptr<NpySource> NpySource::from_directory(const std::string& field_name,
                                                     const std::string& directory) {
  std::shared_ptr<NpySource> source(new NpySource());
  for (const detail::DirectoryEntry& entry : detail::list_directory(directory)) {
    const std::string& name = entry.name;
    // Hidden files are not samples, as `glob("dir/*.npy")` has it: a ".x.npy"
    // backup or the "._x.npy" AppleDouble file a macOS copy leaves would
    // otherwise sort first and shift every index by one.
    if (name.front() != '.' && name.size() > 4 && name.compare(name.size() - 4, 4, ".npy") == 0) {
      source->files_.push_back(directory + "/" + name);
    }
  }
  if (source->files_.empty()) {
    throw InvalidArgument("directory '" + directory + "' holds no .npy files");
  }
  std::sort(source->files_.begin(), source->files_.end());
  source->rows_ = static_cast<int64_t>(source->files_.size());
  // The first file sets the field's dtype and (expected) shape.
  const std::vector<std::byte> head =
      detail::read_file_prefix(source->files_.front(), kNpyMaxHeaderBytes);
  const NpyHeader header = parse_npy_header(head, source->files_.front());
  source->specs_.push_back({field_name, header.dtype, header.shape});
  source->sample_bytes_ = data_bytes(header, source->files_.front());
  source->description_ = "NpySource(" + directory + "/*.npy)";
  return source;
}

void NpySource::read_sample(int64_t index, SampleWriter& writer) const {
  if (index < 0 || index >= rows_) {
    throw InvalidArgument("index " + std::to_string(index) + " out of range for " +
                          std::to_string(rows_) + " samples");
  }
  if (files_.empty()) {
    read_from_arrays(index, writer);
  } else {
    read_from_file(index, writer);
  }
}

namespace {

[[noreturn]] void throw_row_gone(const std::string& path, int64_t index) {
  throw FormatError("'" + path + "': row " + std::to_string(index) +
                    " is no longer in the file (it was truncated or rewritten while being read)");
}

struct StridedGather {
  const std::byte* src;
  const Shape* shape;
  const Shape* strides;
  size_t itemsize;
  std::byte* dst;
  static void run(void* self) {
    const auto& gather = *static_cast<const StridedGather*>(self);
    copy_strided(gather.src, *gather.shape, *gather.strides, gather.itemsize, gather.dst);
  }
};

}  // namespace

void NpySource::read_from_arrays(int64_t index, SampleWriter& writer) const {
  const detail::Stores stores =
      writer.prefers_streaming_stores() ? detail::Stores::kStreaming : detail::Stores::kCached;
  for (size_t f = 0; f < arrays_.size(); ++f) {
    const MappedArray& array = arrays_[f];
    const size_t offset = array.row_offset(index);
    const std::span<std::byte> dst = writer.field_buffer(f, array.row_shape);
    if (dst.empty()) continue;
    if (array.pread_rows) {
      // A C-order row is contiguous.
      if (!detail::read_noting_misses(*array.reader, *array.mapping, offset, dst, stores)) {
        storage_reads_.fetch_add(1, std::memory_order_relaxed);
      }
    } else if (!array.header.fortran_order) {
      // The mapping covers the file as it was at open; a row beyond the
      // file's size then, or a page the file has lost since, is an error.
      if (!range_fits(offset, dst.size(), array.mapping->size()) ||
          !detail::mapped_bytes_still_in_file(*array.reader, array.mapping->size(),
                                              offset + dst.size()) ||
          !detail::guarded_copy(dst.data(), array.mapping->data() + offset, dst.size(), stores)) {
        throw_row_gone(array.path, index);
      }
    } else {
      // A Fortran row is gathered from the whole data: the file must still
      // hold all of it, and a page lost meanwhile is caught as for C rows.
      StridedGather gather{array.mapping->data() + offset, &array.row_shape, &array.row_strides,
                           dtype_size(array.header.dtype), dst.data()};
      if (!detail::mapped_bytes_still_in_file(*array.reader, array.mapping->size(),
                                              array.mapping->size()) ||
          !detail::guarded_call(&StridedGather::run, &gather)) {
        throw_row_gone(array.path, index);
      }
    }
  }
}

bool NpySource::in_memory(int64_t index) const noexcept {
  if (index < 0 || index >= rows_) return true;
  for (const MappedArray& array : arrays_) {
    if (array.header.fortran_order || array.mapping == nullptr) continue;
    const size_t offset = array.row_offset(index);
    if (range_fits(offset, array.row_step, array.mapping->size()) &&
        !detail::is_resident(array.mapping->data() + offset, array.row_step)) {
      return false;
    }
  }
  return true;
}

void NpySource::will_need(int64_t index) const noexcept {
  if (index < 0 || index >= rows_) return;
  for (const MappedArray& array : arrays_) {
    // C order, so a row's bytes are its step (pread rows and rows copied
    // from the mapping alike).
    if (array.header.fortran_order || array.mapping == nullptr) continue;
    array.reader->will_need(array.row_offset(index), array.row_step);
  }
}

void NpySource::will_need_around(int64_t index) const noexcept {
  if (index < 0 || index >= rows_) return;
  for (const MappedArray& array : arrays_) {
    if (!array.read_around) continue;
    array.read_around->announce(array.row_offset(index));
  }
}

void NpySource::will_read(int64_t index) const noexcept {
  if (index < 0 || index >= rows_) return;
  for (const MappedArray& array : arrays_) {
    // Rows copied from the mapping; pread rows are the kernel's to bring in.
    if (array.pread_rows || array.mapping == nullptr || array.header.fortran_order) continue;
    const size_t offset = array.row_offset(index);
    if (!range_fits(offset, array.row_step, array.mapping->size())) continue;
    detail::prefetch_for_copy(array.mapping->data() + offset, array.row_step);
  }
}

void NpySource::read_from_file(int64_t index, SampleWriter& writer) const {
  const std::string& path = files_[static_cast<size_t>(index)];
  detail::File file(path);
  const std::vector<std::byte> head = file.read_prefix(kNpyMaxHeaderBytes);
  const NpyHeader header = parse_npy_header(head, path);
  if (header.dtype != specs_[0].dtype) {
    throw FormatError("'" + path + "': dtype " + std::string(dtype_name(header.dtype)) +
                      " differs from the " + std::string(dtype_name(specs_[0].dtype)) +
                      " of the directory's first file");
  }
  const size_t bytes = data_bytes(header, path);
  check_data_fits(header, bytes, file.size(), path);
  const std::span<std::byte> dst = writer.field_buffer(0, header.shape);
  if (!header.fortran_order || header.shape.size() < 2) {
    // C order, or one dimension or none: the file's bytes are the sample's.
    file.read_exact(header.data_offset, dst);
    return;
  }
  // Fortran order (np.save of a transposed array, MATLAB's and Julia's
  // writers): read whole, then gathered into C order as numpy.load returns it.
  std::vector<std::byte> stored(bytes);
  file.read_exact(header.data_offset, stored);
  copy_strided(stored.data(), header.shape, fortran_strides(header.shape), dtype_size(header.dtype),
               dst.data());
}

std::string NpySource::sample_location(int64_t index) const {
  if (!files_.empty()) return files_[static_cast<size_t>(index)];
  return arrays_.front().path + " row " + std::to_string(index);
}

}  // namespace leanloader
