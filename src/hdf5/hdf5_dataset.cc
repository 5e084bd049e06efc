#include "hdf5/hdf5_dataset.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include "leanloader/core/checked_size.h"
#include "leanloader/core/error.h"

namespace leanloader::detail {

std::mutex& hdf5_mutex() {
  static std::mutex mutex;
  return mutex;
}

namespace {

// Closes an HDF5 identifier on scope exit; the caller holds the mutex.
class Id {
 public:
  Id(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  ~Id() {
    if (id_ >= 0) close_(id_);
  }
  Id(const Id&) = delete;
  Id& operator=(const Id&) = delete;
  hid_t get() const noexcept { return id_; }
  bool ok() const noexcept { return id_ >= 0; }
  hid_t release() noexcept { return std::exchange(id_, -1); }

 private:
  hid_t id_;
  herr_t (*close_)(hid_t);
};

void init_library_locked() {
  static bool initialised = false;
  if (initialised) return;
  H5open();
  // Errors are reported through our exceptions, not printed by the library.
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  initialised = true;
}

herr_t collect_error(unsigned, const H5E_error2_t* error, void* data) {
  auto* messages = static_cast<std::vector<std::string>*>(data);
  if (error->desc != nullptr && error->desc[0] != '\0' && messages->size() < 4) {
    messages->emplace_back(error->desc);
  }
  return 0;
}

// The library's own account of the last failure, then cleared.
std::string error_stack_locked() {
  std::vector<std::string> messages;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect_error, &messages);
  H5Eclear2(H5E_DEFAULT);
  std::string text;
  for (const std::string& message : messages) text += (text.empty() ? "" : "; ") + message;
  return text.empty() ? "no detail from the HDF5 library" : text;
}

const char* class_name(H5T_class_t type_class) {
  switch (type_class) {
    case H5T_COMPOUND:
      return "compound";
    case H5T_STRING:
      return "string";
    case H5T_VLEN:
      return "variable-length";
    case H5T_ARRAY:
      return "array";
    case H5T_REFERENCE:
      return "reference";
    case H5T_OPAQUE:
      return "opaque";
    case H5T_BITFIELD:
      return "bitfield";
    case H5T_TIME:
      return "time";
    default:
      return "unknown";
  }
}

std::string member_name_locked(hid_t type, unsigned member) {
  char* name = H5Tget_member_name(type, member);
  if (name == nullptr) return {};
  std::string out(name);
  H5free_memory(name);
  return out;
}

struct TypeInfo {
  DType dtype;
  bool little_endian;
};

TypeInfo classify_type_locked(hid_t type, const std::string& where) {
  const H5T_class_t type_class = H5Tget_class(type);
  const size_t size = H5Tget_size(type);
  const bool little = H5Tget_order(type) == H5T_ORDER_LE;
  auto cannot = [&](const std::string& what) -> TypeInfo {
    throw InvalidArgument(where + " has " + what +
                          " elements, which cannot become a tensor (HDF5Source reads integer, "
                          "float and bool datasets; neither its own reader nor H5Dread applies)");
  };
  if (type_class == H5T_INTEGER) {
    if (H5Tget_precision(type) != size * 8 || H5Tget_offset(type) != 0) {
      return cannot("padded " + std::to_string(H5Tget_precision(type)) + "-bit integer");
    }
    const bool is_signed = H5Tget_sign(type) == H5T_SGN_2;
    switch (size) {
      case 1:
        return {is_signed ? DType::kI8 : DType::kU8, true};
      case 2:
        return {is_signed ? DType::kI16 : DType::kU16, little};
      case 4:
        return {is_signed ? DType::kI32 : DType::kU32, little};
      case 8:
        return {is_signed ? DType::kI64 : DType::kU64, little};
      default:
        return cannot(std::to_string(size * 8) + "-bit integer");
    }
  }
  if (type_class == H5T_FLOAT) {
    size_t sign_pos = 0, exp_pos = 0, exp_size = 0, mant_pos = 0, mant_size = 0;
    H5Tget_fields(type, &sign_pos, &exp_pos, &exp_size, &mant_pos, &mant_size);
    const size_t bias = H5Tget_ebias(type);
    auto fields_are = [&](size_t s, size_t ep, size_t es, size_t ms, size_t b) {
      return sign_pos == s && exp_pos == ep && exp_size == es && mant_pos == 0 && mant_size == ms &&
             bias == b && H5Tget_offset(type) == 0;
    };
    if (size == 2 && fields_are(15, 10, 5, 10, 15)) return {DType::kF16, little};
    if (size == 2 && fields_are(15, 7, 8, 7, 127)) return {DType::kBF16, little};
    if (size == 4 && fields_are(31, 23, 8, 23, 127)) return {DType::kF32, little};
    if (size == 8 && fields_are(63, 52, 11, 52, 1023)) return {DType::kF64, little};
    return cannot("non-IEEE " + std::to_string(size * 8) + "-bit float");
  }
  if (type_class == H5T_ENUM) {
    Id base(H5Tget_super(type), H5Tclose);
    if (!base.ok()) return cannot("enum");
    // h5py stores bool as an 8-bit enum {FALSE = 0, TRUE = 1}.
    if (H5Tget_size(base.get()) == 1 && H5Tget_nmembers(type) == 2 &&
        member_name_locked(type, 0) == "FALSE" && member_name_locked(type, 1) == "TRUE") {
      return {DType::kBool, true};
    }
    return classify_type_locked(base.get(), where);
  }
  return cannot(class_name(type_class));
}

// True when every component of `path` ("a/b/c") is a link in `file`.
bool link_exists_locked(hid_t file, const std::string& path) {
  size_t end = 0;
  while (end != std::string::npos) {
    end = path.find('/', end + 1);
    const std::string prefix = path.substr(0, end);
    if (prefix.empty() || prefix == "/") continue;
    if (H5Lexists(file, prefix.c_str(), H5P_DEFAULT) <= 0) return false;
  }
  return true;
}

bool is_undefined(uint64_t address) { return address == HADDR_UNDEF; }

}  // namespace

Hdf5Dataset::Hdf5Dataset(const std::string& file_path, const std::string& dataset)
    : path(file_path), name(dataset), owner_pid(::getpid()) {
  reader = std::make_unique<File>(path);  // a missing file is FileNotFoundError
  const std::string here = "'" + path + "' dataset '" + name + "'";
  std::lock_guard lock(hdf5_mutex());
  init_library_locked();
  Id file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!file.ok()) {
    throw FormatError("'" + path + "': HDF5 cannot open the file (" + error_stack_locked() + ")");
  }
  if (name.empty() || !link_exists_locked(file.get(), name)) {
    H5Eclear2(H5E_DEFAULT);
    throw FormatError("'" + path + "' has no dataset '" + name + "'");
  }
  Id dset(H5Dopen2(file.get(), name.c_str(), H5P_DEFAULT), H5Dclose);
  if (!dset.ok()) {
    throw FormatError(here + ": HDF5 cannot open it as a dataset (" + error_stack_locked() + ")");
  }
  Id type(H5Dget_type(dset.get()), H5Tclose);
  Id space(H5Dget_space(dset.get()), H5Sclose);
  Id plist(H5Dget_create_plist(dset.get()), H5Pclose);
  if (!type.ok() || !space.ok() || !plist.ok()) {
    throw FormatError(here + ": cannot read its description (" + error_stack_locked() + ")");
  }
  const TypeInfo info = classify_type_locked(type.get(), here);
  dtype = info.dtype;
  element_size = dtype_size(dtype);

  const int ndims = H5Sget_simple_extent_ndims(space.get());
  if (H5Sget_simple_extent_type(space.get()) != H5S_SIMPLE || ndims < 1) {
    throw InvalidArgument(here + " is a scalar or empty dataspace; HDF5Source needs rows (axis 0)");
  }
  std::vector<hsize_t> dims(static_cast<size_t>(ndims));
  H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  for (const hsize_t d : dims) {
    if (d > static_cast<hsize_t>(std::numeric_limits<int64_t>::max())) {
      throw FormatError(here + ": dimension " + std::to_string(d) + " is too large");
    }
    shape.push_back(static_cast<int64_t>(d));
  }
  rows = shape[0];
  row_shape.assign(shape.begin() + 1, shape.end());
  const auto row_size = checked_nbytes(row_shape, dtype);
  const auto total = row_size ? checked_mul(*row_size, static_cast<size_t>(rows)) : std::nullopt;
  if (!total) throw FormatError(here + ": shape " + shape_to_string(shape) + " overflows size_t");
  row_bytes = *row_size;

  // The memory type for H5Dread: the file's type, in this machine's byte order.
  Id mem_type(H5Tcopy(type.get()), H5Tclose);
  if (!mem_type.ok()) throw FormatError(here + ": " + error_stack_locked());
  if (!info.little_endian) H5Tset_order(mem_type.get(), H5T_ORDER_LE);

  const H5D_layout_t layout = H5Pget_layout(plist.get());
  if (layout == H5D_COMPACT) {
    data.resize(*total);
    if (H5Dread(dset.get(), mem_type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()) < 0) {
      throw FormatError(here + ": H5Dread of the compact data failed (" + error_stack_locked() +
                        ")");
    }
    read_path = Hdf5ReadPath::kMemory;
  } else if (!info.little_endian) {
    library_reason = "big-endian " + std::string(dtype_name(dtype)) + " is converted by H5Dread";
  } else if (layout == H5D_CONTIGUOUS) {
    const haddr_t address = H5Dget_offset(dset.get());
    if (H5Pget_external_count(plist.get()) > 0) {
      library_reason = "external storage";
    } else if (is_undefined(address)) {
      H5Eclear2(H5E_DEFAULT);
      library_reason = "no storage allocated (fill values)";
    } else if (!range_fits(address, *total, reader->size())) {
      throw FormatError(here + ": its " + std::to_string(*total) + " bytes at offset " +
                        std::to_string(address) + " run past the end of the file (" +
                        std::to_string(reader->size()) + " bytes): truncated");
    } else {
      offset = address;
      read_path = Hdf5ReadPath::kPread;
    }
  } else if (layout == H5D_CHUNKED) {
    index_chunks_locked(dset.get(), plist.get(), here);
  } else {
    library_reason = "virtual or unknown layout";
  }
  memory_type = mem_type.release();
  dataset_id = dset.release();
  file_id = file.release();
}

Hdf5Dataset::~Hdf5Dataset() {
  // A forked child must not touch the library state it inherited mid-flight.
  if (::getpid() != owner_pid) return;
  std::lock_guard lock(hdf5_mutex());
  if (memory_type >= 0) H5Tclose(memory_type);
  if (dataset_id >= 0) H5Dclose(dataset_id);
  if (file_id >= 0) H5Fclose(file_id);
}

void Hdf5Dataset::index_chunks_locked(hid_t dset, hid_t plist, const std::string& here) {
  const size_t ndim = shape.size();
  std::vector<hsize_t> chunk_dims(ndim);
  if (H5Pget_chunk(plist, static_cast<int>(ndim), chunk_dims.data()) != static_cast<int>(ndim)) {
    throw FormatError(here + ": cannot read its chunk shape (" + error_stack_locked() + ")");
  }
  for (size_t d = 0; d < ndim; ++d) {
    if (chunk_dims[d] == 0) throw FormatError(here + ": a chunk dimension is 0");
    chunk_shape.push_back(static_cast<int64_t>(chunk_dims[d]));
    chunk_grid.push_back(
        static_cast<int64_t>((static_cast<hsize_t>(shape[d]) + chunk_dims[d] - 1) / chunk_dims[d]));
  }
  const auto bytes = checked_nbytes(chunk_shape, dtype);
  const auto count = checked_numel(chunk_grid);
  if (!bytes || !count) throw FormatError(here + ": chunk shape overflows size_t");
  chunk_bytes = *bytes;

  const int filter_count = H5Pget_nfilters(plist);
  for (int k = 0; k < filter_count; ++k) {
    unsigned flags = 0;
    unsigned config = 0;
    size_t values = 16;
    std::vector<unsigned> client_data(values);
    char filter_name[128] = {};
    H5Z_filter_t id = H5Pget_filter2(plist, static_cast<unsigned>(k), &flags, &values,
                                     client_data.data(), sizeof filter_name, filter_name, &config);
    if (values > client_data.size()) {
      client_data.resize(values);
      id = H5Pget_filter2(plist, static_cast<unsigned>(k), &flags, &values, client_data.data(),
                          sizeof filter_name, filter_name, &config);
    }
    if (id < 0)
      throw FormatError(here + ": cannot read its filters (" + error_stack_locked() + ")");
    client_data.resize(values);
    filters.push_back({static_cast<int>(id), std::move(client_data), filter_name});
  }
  for (const Hdf5Filter& filter : filters) {
    if (!hdf5_filter_supported(filter.id)) {
      library_reason = "filter '" + filter.name + "' (id " + std::to_string(filter.id) +
                       ") is not decoded by leanloader";
      return;
    }
  }
  if (*count > (size_t{1} << 24)) {
    library_reason = std::to_string(*count) + " chunks is more than leanloader indexes";
    return;
  }
  // The chunk index: one B-tree lookup per grid cell (H5Dget_chunk_info by
  // position is linear per call in HDF5 1.10, so quadratic over a dataset).
  chunks.resize(*count);
  std::vector<hsize_t> position(ndim, 0);
  for (size_t c = 0; c < *count; ++c) {
    size_t rest = c;
    for (size_t d = ndim; d-- > 0;) {
      const size_t g = static_cast<size_t>(chunk_grid[d]);
      position[d] = static_cast<hsize_t>(rest % g) * chunk_dims[d];
      rest /= g;
    }
    unsigned mask = 0;
    haddr_t address = HADDR_UNDEF;
    hsize_t stored = 0;
    if (H5Dget_chunk_info_by_coord(dset, position.data(), &mask, &address, &stored) < 0) {
      throw FormatError(here + ": cannot read its chunk index (" + error_stack_locked() + ")");
    }
    chunks[c] = {address, stored, mask};
  }
  chunk_is_row = chunk_shape[0] == 1 &&
                 std::equal(chunk_shape.begin() + 1, chunk_shape.end(), shape.begin() + 1);
  read_path = Hdf5ReadPath::kChunks;
}

std::string Hdf5Dataset::where(int64_t row) const {
  return "'" + path + "' dataset '" + name + "' row " + std::to_string(row);
}

void Hdf5Dataset::read_row(int64_t row, std::span<std::byte> dst, ChunkCache* cache) const {
  try {
    switch (read_path) {
      case Hdf5ReadPath::kPread:
        reader->read_exact(offset + static_cast<size_t>(row) * row_bytes, dst);
        return;
      case Hdf5ReadPath::kMemory:
        std::memcpy(dst.data(), data.data() + static_cast<size_t>(row) * row_bytes, row_bytes);
        return;
      case Hdf5ReadPath::kChunks:
        read_row_chunks(row, dst, cache);
        return;
      case Hdf5ReadPath::kLibrary:
        read_row_library(row, dst);
        return;
    }
  } catch (const SampleError&) {
    throw;
  } catch (const Error& e) {
    const std::string prefix = where(row);
    const std::string message = e.what();
    if (message.compare(0, prefix.size(), prefix) == 0) throw;
    throw Error(prefix + ": " + message, e.kind(), e.error_number());
  }
}

void Hdf5Dataset::read_row_library(int64_t row, std::span<std::byte> dst) const {
  const size_t ndim = shape.size();
  std::vector<hsize_t> start(ndim, 0);
  std::vector<hsize_t> count(shape.begin(), shape.end());
  start[0] = static_cast<hsize_t>(row);
  count[0] = 1;
  const hsize_t elements = static_cast<hsize_t>(row_bytes / element_size);
  std::lock_guard lock(hdf5_mutex());
  Id file_space(H5Dget_space(dataset_id), H5Sclose);
  Id memory_space(H5Screate_simple(1, &elements, nullptr), H5Sclose);
  const bool ok = file_space.ok() && memory_space.ok() &&
                  H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start.data(), nullptr,
                                      count.data(), nullptr) >= 0 &&
                  H5Dread(dataset_id, memory_type, memory_space.get(), file_space.get(),
                          H5P_DEFAULT, dst.data()) >= 0;
  if (!ok) {
    throw FormatError(
        where(row) + ": H5Dread failed (" + error_stack_locked() +
        "); this dataset is read through the HDF5 library because " +
        (library_reason.empty() ? std::string("a chunk was never written") : library_reason));
  }
}

std::span<const std::byte> Hdf5Dataset::read_raw(size_t chunk, int64_t row,
                                                 std::vector<std::byte>& buffer) const {
  const Hdf5ChunkLocation& location = chunks[chunk];
  if (!range_fits(location.address, location.size, reader->size())) {
    throw FormatError(where(row) + ": chunk " + std::to_string(chunk) + " (" +
                      std::to_string(location.size) + " bytes at offset " +
                      std::to_string(location.address) + ") runs past the end of the file (" +
                      std::to_string(reader->size()) + " bytes): truncated or corrupt");
  }
  if (buffer.size() < location.size) buffer.resize(location.size);
  const std::span<std::byte> raw(buffer.data(), location.size);
  reader->read_exact(location.address, raw);
  return raw;
}

void Hdf5Dataset::decode_into(size_t chunk, int64_t row, std::span<std::byte> dst) const {
  const Hdf5ChunkLocation& location = chunks[chunk];
  const bool unfiltered =
      filters.empty() ||
      (filters.size() < 32 && location.filter_mask == (uint32_t{1} << filters.size()) - 1);
  if (unfiltered && location.size == dst.size() &&
      range_fits(location.address, location.size, reader->size())) {
    reader->read_exact(location.address, dst);  // straight into the row: no copy
    return;
  }
  // The stored bytes go to a per-thread buffer (no allocation per chunk),
  // except for chunks too large to keep around.
  constexpr size_t kKeptBufferBytes = size_t{64} << 20;
  thread_local std::vector<std::byte> kept;
  std::vector<std::byte> local;
  const std::span<const std::byte> raw =
      read_raw(chunk, row, location.size <= kKeptBufferBytes ? kept : local);
  try {
    decode_chunk_into(raw, filters, location.filter_mask, dst, element_size);
  } catch (const Error& e) {
    throw Error(where(row) + ": chunk " + std::to_string(chunk) + " at offset " +
                    std::to_string(location.address) + ": " + e.what(),
                e.kind(), e.error_number());
  }
}

std::shared_ptr<const std::vector<std::byte>> Hdf5Dataset::load_chunk(size_t chunk, int64_t row,
                                                                      ChunkCache* cache) const {
  const bool shared = cache != nullptr && chunk_shape[0] > 1 && chunk_bytes <= cache->budget() / 4;
  if (shared) {
    if (auto hit = cache->find(this, chunk)) return hit;
  }
  auto decoded = std::make_shared<std::vector<std::byte>>(chunk_bytes);
  decode_into(chunk, row, *decoded);
  if (shared) cache->insert(this, chunk, decoded);
  return decoded;
}

void Hdf5Dataset::read_row_chunks(int64_t row, std::span<std::byte> dst, ChunkCache* cache) const {
  const size_t ndim = shape.size();
  const size_t along = static_cast<size_t>(row / chunk_shape[0]);
  const size_t within = static_cast<size_t>(row % chunk_shape[0]);
  size_t inner_chunks = 1;
  for (size_t d = 1; d < ndim; ++d) inner_chunks *= static_cast<size_t>(chunk_grid[d]);
  const size_t first = along * inner_chunks;
  for (size_t g = 0; g < inner_chunks; ++g) {
    if (is_undefined(chunks[first + g].address)) {
      read_row_library(row, dst);  // the library knows the fill value
      return;
    }
  }
  if (chunk_is_row) {
    decode_into(first, row, dst);
    return;
  }
  // Copy the part of each chunk that holds this row into its place in the
  // row: chunks are C-order boxes of chunk_shape, edge chunks stored whole.
  const size_t inner = ndim - 1;
  size_t chunk_row_bytes = element_size;  // one index of axis 0 within a chunk
  for (size_t d = 1; d < ndim; ++d) chunk_row_bytes *= static_cast<size_t>(chunk_shape[d]);
  // Byte strides of the row's axes (dataset axes 1..) inside a chunk and inside the row.
  std::vector<size_t> chunk_strides(inner, element_size);
  std::vector<size_t> row_strides(inner, element_size);
  for (size_t d = inner; d-- > 1;) {
    chunk_strides[d - 1] = chunk_strides[d] * static_cast<size_t>(chunk_shape[d + 1]);
    row_strides[d - 1] = row_strides[d] * static_cast<size_t>(row_shape[d]);
  }
  const size_t row_in_chunk = within * chunk_row_bytes;
  std::vector<size_t> grid_pos(inner, 0);
  std::vector<size_t> extent(inner, 0);
  std::vector<size_t> counter(inner, 0);
  for (size_t g = 0; g < inner_chunks; ++g) {
    size_t rest = g;
    for (size_t d = inner; d-- > 0;) {
      const size_t cells = static_cast<size_t>(chunk_grid[d + 1]);
      grid_pos[d] = rest % cells;
      rest /= cells;
    }
    const auto decoded = load_chunk(first + g, row, cache);
    const std::byte* src = decoded->data() + row_in_chunk;
    if (inner == 0) {
      std::memcpy(dst.data(), src, element_size);
      continue;
    }
    size_t dst_base = 0;
    for (size_t d = 0; d < inner; ++d) {
      const size_t begin = grid_pos[d] * static_cast<size_t>(chunk_shape[d + 1]);
      extent[d] = std::min(static_cast<size_t>(chunk_shape[d + 1]),
                           static_cast<size_t>(row_shape[d]) - begin);
      dst_base += begin * row_strides[d];
    }
    const size_t run = extent[inner - 1] * element_size;  // contiguous along the last axis
    std::fill(counter.begin(), counter.end(), 0);
    while (true) {
      size_t src_offset = 0;
      size_t dst_offset = dst_base;
      for (size_t d = 0; d + 1 < inner; ++d) {
        src_offset += counter[d] * chunk_strides[d];
        dst_offset += counter[d] * row_strides[d];
      }
      std::memcpy(dst.data() + dst_offset, src + src_offset, run);
      size_t d = inner - 1;
      while (d-- > 0) {
        if (++counter[d] < extent[d]) break;
        counter[d] = 0;
      }
      if (d == static_cast<size_t>(-1)) break;
    }
  }
}

std::shared_ptr<const std::vector<std::byte>> ChunkCache::find(const void* owner, size_t chunk) {
  std::lock_guard lock(mutex_);
  const auto found = entries_.find({owner, chunk});
  if (found == entries_.end()) return nullptr;
  order_.splice(order_.begin(), order_, found->second);
  return found->second->data;
}

void ChunkCache::insert(const void* owner, size_t chunk,
                        std::shared_ptr<const std::vector<std::byte>> data) {
  std::lock_guard lock(mutex_);
  const Key key{owner, chunk};
  if (entries_.count(key) != 0 || data->size() > budget_) return;
  bytes_ += data->size();
  order_.push_front({key, std::move(data)});
  entries_[key] = order_.begin();
  while (bytes_ > budget_ && !order_.empty()) {
    bytes_ -= order_.back().data->size();
    entries_.erase(order_.back().key);
    order_.pop_back();
  }
}

size_t ChunkCache::bytes() const {
  std::lock_guard lock(mutex_);
  return bytes_;
}

}  // namespace leanloader::detail
