#include "hdf5/hdf5_dataset.h"

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <utility>

#include "leanloader/core/checked_size.h"
#include "leanloader/core/error.h"
#include "leanloader/hdf5/hdf5_library.h"

namespace leanloader::detail {

namespace {

// Closes an HDF5 identifier on scope exit; the caller holds Hdf5Lock.
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
  // Closes the identifier held (if any) and holds `id`.
  void reset(hid_t id) noexcept {
    if (id_ >= 0) close_(id_);
    id_ = id;
  }

 private:
  hid_t id_;
  herr_t (*close_)(hid_t);
};

const char* class_name(H5TClass type_class) {
  switch (type_class) {
    case H5TClass::kCompound:
      return "compound";
    case H5TClass::kString:
      return "string";
    case H5TClass::kVlen:
      return "variable-length";
    case H5TClass::kArray:
      return "array";
    case H5TClass::kReference:
      return "reference";
    case H5TClass::kOpaque:
      return "opaque";
    case H5TClass::kTime:
      return "time";
    case H5TClass::kComplex:
      return "complex";
    default:
      return "unknown";
  }
}

std::string member_name_locked(hid_t type, unsigned member) {
  const Hdf5Api& api = hdf5_api();
  char* name = api.t_get_member_name(type, member);
  if (name == nullptr) return {};
  std::string out(name);
  api.free_memory(name);
  return out;
}

struct TypeInfo {
  DType dtype;
  bool little_endian;
  // Stored otherwise than the tensor's element, H5Dread converts it: n-bit
  // integers (widened), floats without IEEE's implied mantissa bit, bool
  // enums over a wider integer.
  bool converted;
  const char* conversion = "n-bit ";  // for the reason the library reads it
};

TypeInfo integer_type(size_t size, bool is_signed, bool little, bool converted,
                      const std::string& where) {
  switch (size) {
    case 1:
      return {is_signed ? DType::kI8 : DType::kU8, true, converted};
    case 2:
      return {is_signed ? DType::kI16 : DType::kU16, little, converted};
    case 4:
      return {is_signed ? DType::kI32 : DType::kU32, little, converted};
    case 8:
      return {is_signed ? DType::kI64 : DType::kU64, little, converted};
    default:
      throw InvalidArgument(where + " has " + std::to_string(size * 8) +
                            "-bit integer elements, which cannot become a tensor");
  }
}

TypeInfo classify_type_locked(hid_t type, const std::string& where);

// h5py's bool: an enum of exactly {FALSE: 0, TRUE: 1}, in either order, over
// an integer of any size and byte order (h5py reads any other enum as its
// base integer).
bool is_bool_enum_locked(hid_t type, hid_t base) {
  const Hdf5Api& api = hdf5_api();
  const size_t size = api.t_get_size(base);
  if (api.t_get_nmembers(type) != 2 || size == 0 || size > 8 ||
      static_cast<H5TClass>(api.t_get_class(base)) != H5TClass::kInteger) {
    return false;
  }
  const bool little = api.t_get_order(base) == kH5TOrderLe;
  const bool is_signed = api.t_get_sign(base) == kH5TSgn2;
  std::string names[2];
  for (unsigned member = 0; member < 2; ++member) {
    unsigned char bytes[8] = {};
    if (api.t_get_member_value(type, member, bytes) < 0) {
      api.e_clear2(kH5Default);
      return false;
    }
    int64_t value = 0;
    for (size_t i = 0; i < size; ++i) {
      const unsigned char byte = bytes[little ? size - 1 - i : i];  // most significant first
      value = static_cast<int64_t>(static_cast<uint64_t>(value) << 8 | byte);
    }
    if (is_signed && size < 8 && (bytes[little ? size - 1 : 0] & 0x80) != 0) {
      value -= int64_t{1} << (8 * size);
    }
    names[member] = member_name_locked(type, member);
    const std::string& name = names[member];
    if (!((name == "FALSE" && value == 0) || (name == "TRUE" && value == 1))) return false;
  }
  return names[0] != names[1];
}

// Complex numbers as h5py reads them: its compound of two IEEE floats of one
// type and byte order named "r" and "i" (h5py's complex_names; PyTables
// writes the same) at offsets 0 and the float's size, or HDF5 2.0's complex
// class: two 32-bit floats are a complex64, two 64-bit floats a complex128.
// h5py's complex256 (two 80-bit long doubles) is named as complex, not as
// the non-IEEE float classify_type_locked would call its parts.
void throw_unless_complex_parts(size_t part_bytes, const std::string& where) {
  if (part_bytes == 4 || part_bytes == 8) return;
  throw InvalidArgument(where + " has complex elements of two " + std::to_string(part_bytes * 8) +
                        "-bit floats, which cannot become a tensor (complex64 and complex128 "
                        "can)");
}

std::optional<TypeInfo> complex_type_locked(hid_t type, H5TClass type_class,
                                            const std::string& where) {
  const Hdf5Api& api = hdf5_api();
  std::optional<TypeInfo> part;
  if (type_class == H5TClass::kCompound) {
    if (api.t_get_nmembers(type) != 2 || member_name_locked(type, 0) != "r" ||
        member_name_locked(type, 1) != "i") {
      return std::nullopt;
    }
    const Id real(api.t_get_member_type(type, 0), api.t_close);
    const Id imaginary(api.t_get_member_type(type, 1), api.t_close);
    if (!real.ok() || !imaginary.ok() ||
        static_cast<H5TClass>(api.t_get_class(real.get())) != H5TClass::kFloat ||
        static_cast<H5TClass>(api.t_get_class(imaginary.get())) != H5TClass::kFloat) {
      api.e_clear2(kH5Default);
      return std::nullopt;
    }
    // The layout of numpy's complex: the real part at 0, the imaginary part
    // right after it, nothing else.
    const size_t part_bytes = api.t_get_size(real.get());
    if (api.t_get_offset(real.get()) != 0 || api.t_get_member_offset(type, 0) != 0 ||
        api.t_get_member_offset(type, 1) != part_bytes || api.t_get_size(type) != 2 * part_bytes) {
      return std::nullopt;
    }
    throw_unless_complex_parts(part_bytes, where);
    const TypeInfo r = classify_type_locked(real.get(), where);
    const TypeInfo i = classify_type_locked(imaginary.get(), where);
    if (r.dtype != i.dtype || r.little_endian != i.little_endian || r.converted != i.converted) {
      return std::nullopt;
    }
    part = r;
  } else if (type_class == H5TClass::kComplex) {
    const Id base(api.t_get_super(type), api.t_close);
    if (!base.ok()) {
      api.e_clear2(kH5Default);
      return std::nullopt;
    }
    throw_unless_complex_parts(api.t_get_size(base.get()), where);
    part = classify_type_locked(base.get(), where);
  } else {
    return std::nullopt;
  }
  if (part->converted) {
    // Its parts' bits are not IEEE's; a compound's conversion is not one
    // HDF5Source asks of H5Dread.
    throw InvalidArgument(where + " has complex elements of " + std::string(part->conversion) +
                          "floats, which cannot become a tensor");
  }
  if (part->dtype == DType::kF32) return TypeInfo{DType::kC64, part->little_endian, false};
  if (part->dtype == DType::kF64) return TypeInfo{DType::kC128, part->little_endian, false};
  throw InvalidArgument(where + " has complex elements of two " +
                        std::string(dtype_name(part->dtype)) +
                        " parts, which cannot become a tensor (complex64 and complex128 only)");
}

TypeInfo classify_type_locked(hid_t type, const std::string& where) {
  const Hdf5Api& api = hdf5_api();
  const auto type_class = static_cast<H5TClass>(api.t_get_class(type));
  const size_t size = api.t_get_size(type);
  const bool little = api.t_get_order(type) == kH5TOrderLe;
  auto cannot = [&](const std::string& what) -> TypeInfo {
    throw InvalidArgument(where + " has " + what +
                          " elements, which cannot become a tensor (HDF5Source reads integer, "
                          "bitfield, float, complex and bool elements, and arrays of them)");
  };
  if (type_class == H5TClass::kInteger || type_class == H5TClass::kBitfield) {
    // Bitfields (PyTables' BoolAtom is an 8-bit one) are unsigned integers
    // to h5py; n-bit integers are widened by H5Dread's conversion.
    const bool full = api.t_get_precision(type) == size * 8 && api.t_get_offset(type) == 0;
    const bool is_signed = type_class == H5TClass::kInteger && api.t_get_sign(type) == kH5TSgn2;
    return integer_type(size, is_signed, little, !full, where);
  }
  if (type_class == H5TClass::kFloat) {
    size_t sign_pos = 0, exp_pos = 0, exp_size = 0, mant_pos = 0, mant_size = 0;
    api.t_get_fields(type, &sign_pos, &exp_pos, &exp_size, &mant_pos, &mant_size);
    const size_t bias = api.t_get_ebias(type);
    auto fields_are = [&](size_t s, size_t ep, size_t es, size_t ms, size_t b) {
      return sign_pos == s && exp_pos == ep && exp_size == es && mant_pos == 0 && mant_size == ms &&
             bias == b && api.t_get_offset(type) == 0;
    };
    // IEEE's layout, but with the mantissa's leading bit stored (or any norm
    // but IEEE's implied one): the bits are not IEEE's, H5Dread converts them.
    const bool implied = api.t_get_norm(type) == kH5TNormImplied;
    auto ieee = [&](DType dtype) -> TypeInfo {
      if (implied) return {dtype, little, false};
      return {dtype, little, true, "non-IEEE-normalised "};
    };
    if (size == 2 && fields_are(15, 10, 5, 10, 15)) return ieee(DType::kF16);
    if (size == 2 && fields_are(15, 7, 8, 7, 127)) return ieee(DType::kBF16);
    if (size == 4 && fields_are(31, 23, 8, 23, 127)) return ieee(DType::kF32);
    if (size == 8 && fields_are(63, 52, 11, 52, 1023)) return ieee(DType::kF64);
    return cannot("non-IEEE " + std::to_string(size * 8) + "-bit float");
  }
  if (type_class == H5TClass::kEnum) {
    Id base(api.t_get_super(type), api.t_close);
    if (!base.ok()) return cannot("enum");
    if (is_bool_enum_locked(type, base.get())) {
      // Bytes of 0 and 1 as stored when the base is one byte; else H5Dread
      // converts the values to a one-byte integer.
      const bool one_byte = api.t_get_size(base.get()) == 1;
      return {DType::kBool, true, !one_byte, "bool enum over a wider integer, "};
    }
    return classify_type_locked(base.get(), where);
  }
  if (const std::optional<TypeInfo> complex = complex_type_locked(type, type_class, where)) {
    return *complex;
  }
  return cannot(class_name(type_class));
}

// True when every component of `path` ("a/b/c") is a link in `file`.
bool link_exists_locked(hid_t file, const std::string& path) {
  const Hdf5Api& api = hdf5_api();
  size_t end = 0;
  while (end != std::string::npos) {
    end = path.find('/', end + 1);
    const std::string prefix = path.substr(0, end);
    if (prefix.empty() || prefix == "/") continue;
    // "g/./c": a "." component names the group it is in, as H5Dopen2 takes it;
    // it is no link of its own.
    if (prefix == "." || prefix.ends_with("/.")) continue;
    if (api.l_exists(file, prefix.c_str(), kH5Default) <= 0) return false;
  }
  return true;
}

bool is_undefined(uint64_t address) { return address == kHaddrUndef; }

// The file that holds the object `id` (through an external link, not the
// file that was opened), as an absolute path.
std::string file_of_locked(hid_t id) {
  const Hdf5Api& api = hdf5_api();
  const ssize_t length = api.f_get_name(id, nullptr, 0);
  if (length <= 0) return {};
  std::string name(static_cast<size_t>(length) + 1, '\0');
  api.f_get_name(id, name.data(), name.size());
  name.resize(static_cast<size_t>(length));
  return absolute_path(name);
}

uint64_t userblock_locked(hid_t dset) {
  const Hdf5Api& api = hdf5_api();
  Id file(api.i_get_file_id(dset), api.f_close);
  if (!file.ok()) return 0;
  Id plist(api.f_get_create_plist(file.get()), api.p_close);
  hsize_t size = 0;
  if (!plist.ok() || api.p_get_userblock(plist.get(), &size) < 0) return 0;
  return size;
}

std::string missing_filter_message(const std::string& here, const Hdf5Filter& filter) {
  const std::string label =
      (filter.name.empty() ? std::string("filter") : "filter '" + filter.name + "'") + " (id " +
      std::to_string(filter.id) + ")";
  return here + " is compressed with " + label +
         ", which neither leanloader decodes nor the HDF5 library in use (" +
         hdf5_library_info().path +
         ") has registered: install its plugin (pip install hdf5plugin; leanloader imports it "
         "with h5py) or point HDF5_PLUGIN_PATH at the plugin's directory";
}

// Bytes of a row compared with the library at open; larger rows are compared
// on a contiguous box of their trailing axes at each end.
constexpr size_t kCheckedBytes = size_t{4} << 20;

}  // namespace

LibraryHandles::~LibraryHandles() {
  if (::getpid() != owner_pid_ || open_.empty()) return;
  Hdf5Lock lock;
  for (const Open& open : open_) close(open);
}

void LibraryHandles::close(const Open& open) {
  const Hdf5Api& api = hdf5_api();
  api.d_close(open.dataset);
  api.f_close(open.file);
}

hid_t LibraryHandles::dataset(const Hdf5Dataset& owner) {
  for (auto it = open_.begin(); it != open_.end(); ++it) {
    if (it->owner == &owner) {
      open_.splice(open_.begin(), open_, it);
      return it->dataset;
    }
  }
  const Hdf5Api& api = hdf5_api();
  // The descriptor budget counts these too: make room first.
  while (!open_.empty() && open_.size() >= budget_) {
    close(open_.back());
    open_.pop_back();
  }
  Id file(api.f_open(owner.open_path.c_str(), kH5FAccRdonly, kH5Default), api.f_close);
  if (!file.ok()) {
    throw FormatError("'" + owner.path + "': HDF5 cannot open the file again (" +
                      hdf5_error_stack_locked() + ")");
  }
  owner.identity.check_unchanged(owner.open_path);
  Id dset(api.d_open2(file.get(), owner.name.c_str(), kH5Default), api.d_close);
  if (!dset.ok()) {
    throw FormatError("'" + owner.path + "' dataset '" + owner.name +
                      "': HDF5 cannot open it again (" + hdf5_error_stack_locked() + ")");
  }
  open_.push_front({&owner, file.release(), dset.release()});
  return open_.front().dataset;
}

void LibraryHandles::close_all() noexcept {
  if (::getpid() != owner_pid_) return;
  try {
    Hdf5Lock lock;
    for (const Open& open : open_) close(open);
    open_.clear();
  } catch (...) {
    // No library loaded: nothing was opened.
  }
}

void LibraryHandles::forget(const Hdf5Dataset* owner) {
  for (auto it = open_.begin(); it != open_.end(); ++it) {
    if (it->owner == owner) {
      close(*it);
      open_.erase(it);
      return;
    }
  }
}

Hdf5Dataset::Hdf5Dataset(const std::string& file_path, const std::string& dataset,
                         std::shared_ptr<Hdf5Files> open_files)
    : path(file_path), name(dataset), files(std::move(open_files)), owner_pid(::getpid()) {
  { File probe(path); }  // a missing file is FileNotFoundError, too many files said as such
  open_path = absolute_path(path);
  identity = FileIdentity::of(open_path);
  Hdf5Lock lock;
  const Hdf5Api& api = hdf5_api();
  Id file(api.f_open(path.c_str(), kH5FAccRdonly, kH5Default), api.f_close);
  if (!file.ok()) {
    throw FormatError("'" + path + "': HDF5 cannot open the file to read dataset '" + name + "' (" +
                      hdf5_error_stack_locked() + ")");
  }
  if (name.empty() || !link_exists_locked(file.get(), name)) {
    api.e_clear2(kH5Default);
    throw FormatError("'" + path + "' has no dataset '" + name + "'");
  }
  Id dset(api.d_open2(file.get(), name.c_str(), kH5Default), api.d_close);
  if (!dset.ok()) {
    throw FormatError("'" + path + "' dataset '" + name + "': HDF5 cannot open it as a dataset (" +
                      hdf5_error_stack_locked() + ")");
  }
  describe_locked(file.get(), dset.get());
  // The identifiers close here: fast paths read through files->data, the
  // library path reopens them within files->library's budget.
}

void Hdf5Dataset::describe_locked(hid_t, hid_t dset) {
  const Hdf5Api& api = hdf5_api();
  const std::string here = "'" + path + "' dataset '" + name + "'";
  Id type(api.d_get_type(dset), api.t_close);
  Id space(api.d_get_space(dset), api.s_close);
  Id plist(api.d_get_create_plist(dset), api.p_close);
  if (!type.ok() || !space.ok() || !plist.ok()) {
    throw FormatError(here + ": cannot read its description (" + hdf5_error_stack_locked() + ")");
  }
  // An array element (H5T_ARRAY: PyTables' atoms with a shape) is read as
  // h5py reads it, its dimensions after the dataspace's; `element` is then
  // the type of its values.
  std::vector<hsize_t> array_dims;
  Id array_base(-1, api.t_close);
  if (static_cast<H5TClass>(api.t_get_class(type.get())) == H5TClass::kArray) {
    array_base.reset(api.t_get_super(type.get()));
    const int rank = api.t_get_array_ndims(type.get());
    if (!array_base.ok() || rank < 1 || rank > 32) {
      throw FormatError(here + ": cannot read the shape of its array elements (" +
                        hdf5_error_stack_locked() + ")");
    }
    array_dims.resize(static_cast<size_t>(rank));
    if (api.t_get_array_dims(type.get(), array_dims.data()) != rank) {
      throw FormatError(here + ": cannot read the shape of its array elements (" +
                        hdf5_error_stack_locked() + ")");
    }
    if (static_cast<H5TClass>(api.t_get_class(array_base.get())) == H5TClass::kArray) {
      throw InvalidArgument(here +
                            " has elements that are arrays of arrays, which cannot become a tensor "
                            "(arrays of numbers can)");
    }
  }
  const hid_t element = array_base.ok() ? array_base.get() : type.get();
  const TypeInfo info = classify_type_locked(element, here);
  dtype = info.dtype;
  element_size = dtype_size(dtype);

  const int ndims = api.s_get_simple_extent_ndims(space.get());
  if (api.s_get_simple_extent_type(space.get()) != kH5SSimple || ndims < 1) {
    throw InvalidArgument(here + " is a scalar or empty dataspace; HDF5Source needs rows (axis 0)");
  }
  space_rank = static_cast<size_t>(ndims);
  std::vector<hsize_t> dims(space_rank);
  api.s_get_simple_extent_dims(space.get(), dims.data(), nullptr);
  dims.insert(dims.end(), array_dims.begin(), array_dims.end());
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
  cell_bytes =
      *checked_nbytes(Shape(shape.begin() + static_cast<ptrdiff_t>(space_rank), shape.end()),
                      dtype);  // (a factor of the total, which did not overflow)

  // The memory type for H5Dread: the file's type in this machine's byte
  // order, n-bit integers widened to their whole element.
  // An enum is read as its base integer: HDF5 refuses to change the byte
  // order of an enum that has members (H5Tset_order fails and the type stays
  // big-endian), and converts enum values to integers itself.
  const bool is_enum = static_cast<H5TClass>(api.t_get_class(element)) == H5TClass::kEnum;
  Id base(is_enum ? api.t_get_super(element) : api.t_copy(element), api.t_close);
  Id mem_type(base.ok() ? api.t_copy(base.get()) : -1, api.t_close);
  if (!mem_type.ok()) throw FormatError(here + ": " + hdf5_error_stack_locked());
  bool typed = info.little_endian || api.t_set_order(mem_type.get(), kH5TOrderLe) >= 0;
  if (typed && info.converted) {
    if (static_cast<H5TClass>(api.t_get_class(mem_type.get())) == H5TClass::kFloat) {
      // IEEE's implied mantissa bit: H5Dread converts the stored one.
      typed = api.t_set_norm(mem_type.get(), kH5TNormImplied) >= 0;
    } else {
      // The whole element (a bool enum's wider base made one byte).
      typed = api.t_set_size(mem_type.get(), element_size) >= 0 &&
              api.t_set_offset(mem_type.get(), 0) >= 0 &&
              api.t_set_precision(mem_type.get(), element_size * 8) >= 0;
    }
  }
  if (typed && !array_dims.empty()) {
    // (the array's id is taken before the value type's is closed)
    const hid_t array = api.t_array_create(mem_type.get(), static_cast<unsigned>(array_dims.size()),
                                           array_dims.data());
    mem_type.reset(array);
    typed = mem_type.ok();
  }
  if (!typed) {
    throw FormatError(here + ": HDF5 cannot describe its values in this machine's byte order (" +
                      hdf5_error_stack_locked() + ")");
  }
  memory_type = mem_type.release();

  data_path = file_of_locked(dset);
  if (data_path.empty()) data_path = path;

  const auto layout = static_cast<H5DLayout>(api.p_get_layout(plist.get()));
  if (layout == H5DLayout::kCompact) {
    data.resize(*total);
    if (api.d_read(dset, memory_type, kH5Default, kH5Default, kH5Default, data.data()) < 0) {
      throw FormatError(here + ": H5Dread of the compact data failed (" +
                        hdf5_error_stack_locked() + ")");
    }
    read_path = Hdf5ReadPath::kMemory;
    return;
  }
  if (!info.little_endian || info.converted) {
    library_reason = (info.converted ? std::string(info.conversion) : std::string("big-endian ")) +
                     std::string(dtype_name(dtype)) + " is converted by H5Dread";
    return;
  }
  if (layout == H5DLayout::kContiguous) {
    const haddr_t address = api.d_get_offset(dset);
    if (api.p_get_external_count(plist.get()) > 0) {
      library_reason = "external storage";
      return;
    }
    if (is_undefined(address)) {
      api.e_clear2(kH5Default);
      library_reason = "no storage allocated (fill values)";
      return;
    }
    data_key = files->data.add(data_path);
    const size_t file_size = files->data.get(data_key)->size();
    if (!range_fits(address, *total, file_size)) {
      throw FormatError(here + ": its " + std::to_string(*total) + " bytes at offset " +
                        std::to_string(address) + " run past the end of '" + data_path + "' (" +
                        std::to_string(file_size) + " bytes): truncated");
    }
    offset = address;
    read_path = Hdf5ReadPath::kPread;
  } else if (layout == H5DLayout::kChunked) {
    index_chunks_locked(dset, plist.get(), here);
  } else {
    library_reason = "virtual or unknown layout";
    return;
  }
  if (read_path != Hdf5ReadPath::kLibrary) check_fast_path_locked(dset);
}

void Hdf5Dataset::index_chunks_locked(hid_t dset, hid_t plist, const std::string& here) {
  const Hdf5Api& api = hdf5_api();
  const size_t ndim = shape.size();
  std::vector<hsize_t> chunk_dims(space_rank);
  if (api.p_get_chunk(plist, static_cast<int>(space_rank), chunk_dims.data()) !=
      static_cast<int>(space_rank)) {
    throw FormatError(here + ": cannot read its chunk shape (" + hdf5_error_stack_locked() + ")");
  }
  // A chunk holds whole array elements: their dimensions, one chunk across.
  for (size_t d = space_rank; d < ndim; ++d) chunk_dims.push_back(static_cast<hsize_t>(shape[d]));
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

  const int filter_count = api.p_get_nfilters(plist);
  for (int k = 0; k < filter_count; ++k) {
    unsigned flags = 0;
    unsigned config = 0;
    size_t values = 16;
    std::vector<unsigned> client_data(values);
    char filter_name[128] = {};
    int id = api.p_get_filter2(plist, static_cast<unsigned>(k), &flags, &values, client_data.data(),
                               sizeof filter_name, filter_name, &config);
    if (values > client_data.size()) {
      client_data.resize(values);
      id = api.p_get_filter2(plist, static_cast<unsigned>(k), &flags, &values, client_data.data(),
                             sizeof filter_name, filter_name, &config);
    }
    if (id < 0)
      throw FormatError(here + ": cannot read its filters (" + hdf5_error_stack_locked() + ")");
    client_data.resize(values);
    filters.push_back({id, std::move(client_data), filter_name});
  }
  bool native = true;
  for (const Hdf5Filter& filter : filters) {
    const bool registered = api.z_filter_avail(filter.id) > 0;
    api.e_clear2(kH5Default);
    if (!registered) library_decodes_filters_ = false;
    if (!hdf5_filter_supported(filter.id)) {
      // Found now, not at the first batch: neither reader can decode it.
      if (!registered) throw FormatError(missing_filter_message(here, filter));
      if (native) {
        library_reason = "filter '" + filter.name + "' (id " + std::to_string(filter.id) +
                         ") is decoded by the HDF5 library";
      }
      native = false;
    }
  }
  if (!native) return;
  if (*count > (size_t{1} << 24)) {
    library_reason = std::to_string(*count) + " chunks is more than leanloader indexes";
    return;
  }
  unsigned options = 0;
  api.p_get_chunk_opts(plist, &options);
  const bool partial_unfiltered = (options & kH5DChunkDontFilterPartialChunks) != 0;
  const uint32_t all_skipped =
      filters.size() >= 32 ? ~uint32_t{0} : (uint32_t{1} << filters.size()) - 1;
  // The chunk index: one B-tree lookup per grid cell (H5Dget_chunk_info by
  // position is linear per call in HDF5 1.10, so quadratic over a dataset).
  chunks.resize(*count);
  std::vector<hsize_t> position(ndim, 0);
  for (size_t c = 0; c < *count; ++c) {
    size_t rest = c;
    bool partial = false;
    for (size_t d = ndim; d-- > 0;) {
      const size_t g = static_cast<size_t>(chunk_grid[d]);
      position[d] = static_cast<hsize_t>(rest % g) * chunk_dims[d];
      partial = partial || position[d] + chunk_dims[d] > static_cast<hsize_t>(shape[d]);
      rest /= g;
    }
    unsigned mask = 0;
    haddr_t address = kHaddrUndef;
    hsize_t stored = 0;
    if (api.d_get_chunk_info_by_coord(dset, position.data(), &mask, &address, &stored) < 0) {
      throw FormatError(here + ": cannot read its chunk index (" + hdf5_error_stack_locked() + ")");
    }
    // Edge chunks written under H5D_CHUNK_DONT_FILTER_PARTIAL_CHUNKS are
    // stored as they are, whatever the mask says.
    if (partial && partial_unfiltered) mask = all_skipped;
    chunks[c] = {address, stored, mask};
  }
  chunk_is_row = chunk_shape[0] == 1 &&
                 std::equal(chunk_shape.begin() + 1, chunk_shape.end(), shape.begin() + 1);
  data_key = files->data.add(data_path);
  read_path = Hdf5ReadPath::kChunks;
  // Chunk addresses leave the user block out before HDF5 1.14.4 and include
  // it since; which one this library does is read off a chunk it returns.
  const uint64_t userblock = userblock_locked(dset);
  std::string why;
  if (chunk_base_matches_locked(dset, 0, why)) return;
  if (userblock != 0 && chunk_base_matches_locked(dset, userblock, why)) {
    for (Hdf5ChunkLocation& chunk : chunks) {
      if (!is_undefined(chunk.address)) chunk.address += userblock;
    }
    return;
  }
  read_path = Hdf5ReadPath::kLibrary;
  library_reason = why;
}

bool Hdf5Dataset::chunk_base_matches_locked(hid_t dset, uint64_t base, std::string& why) {
  const Hdf5Api& api = hdf5_api();
  const auto first = std::find_if(chunks.begin(), chunks.end(), [](const Hdf5ChunkLocation& c) {
    return !is_undefined(c.address) && c.size > 0;
  });
  if (first == chunks.end()) return true;  // nothing written: every row is the library's
  const size_t c = static_cast<size_t>(first - chunks.begin());
  std::vector<hsize_t> position(shape.size());
  size_t rest = c;
  for (size_t d = shape.size(); d-- > 0;) {
    const size_t g = static_cast<size_t>(chunk_grid[d]);
    position[d] = static_cast<hsize_t>(rest % g) * static_cast<hsize_t>(chunk_shape[d]);
    rest /= g;
  }
  std::vector<std::byte> library(first->size);
  uint32_t mask = 0;
  if (api.read_chunk(dset, position.data(), &mask, library.data(), library.size()) < 0) {
    why = "H5Dread_chunk cannot read chunk " + std::to_string(c) + " (" +
          hdf5_error_stack_locked() + ")";
    return false;
  }
  const auto file = files->data.get(data_key);
  if (!range_fits(first->address + base, first->size, file->size())) {
    why = "chunk " + std::to_string(c) + " lies past the end of '" + data_path + "'";
    return false;
  }
  std::vector<std::byte> ours(first->size);
  file->read_exact(first->address + base, ours);
  if (ours == library) return true;
  why = "the chunk index's addresses do not hold the chunks H5Dread_chunk returns";
  return false;
}

bool Hdf5Dataset::library_read_locked(hid_t dset, int64_t row, size_t box_from_dim,
                                      std::span<std::byte> dst, std::string* cause) const {
  // Reads the box of `row` whose axes before `box_from_dim` (of the row) are
  // fixed at 0 (first row) or their last index (other rows), and whose later
  // axes are whole: a contiguous range of the row.
  const Hdf5Api& api = hdf5_api();
  const size_t ndim = space_rank;  // (an array element is read whole)
  std::vector<hsize_t> start(ndim, 0);
  std::vector<hsize_t> count(shape.begin(), shape.begin() + static_cast<ptrdiff_t>(ndim));
  start[0] = static_cast<hsize_t>(row);
  count[0] = 1;
  for (size_t d = 1; d <= box_from_dim && d < ndim; ++d) {
    start[d] = row == 0 ? 0 : static_cast<hsize_t>(shape[d] - 1);
    count[d] = 1;
  }
  const hsize_t elements = static_cast<hsize_t>(dst.size() / cell_bytes);
  Id file_space(api.d_get_space(dset), api.s_close);
  Id memory_space(api.s_create_simple(1, &elements, nullptr), api.s_close);
  const bool ok = file_space.ok() && memory_space.ok() &&
                  api.s_select_hyperslab(file_space.get(), kH5SSelectSet, start.data(), nullptr,
                                         count.data(), nullptr) >= 0 &&
                  api.d_read(dset, memory_type, memory_space.get(), file_space.get(), kH5Default,
                             dst.data()) >= 0;
  if (!ok) {
    const std::string stack = hdf5_error_stack_locked();  // (clears the stack)
    if (cause != nullptr) *cause = stack;
  }
  return ok;
}

void Hdf5Dataset::check_fast_path_locked(hid_t dset) {
  if (rows == 0 || row_bytes == 0) return;
  // A filter only leanloader decodes cannot be compared with the library's
  // read; its raw chunks were (chunk_base_matches_locked).
  if (!library_decodes_filters_) return;
  // The box: trailing axes of the row whose bytes fit kCheckedBytes.
  size_t box_from_dim = 0;  // axes of the row before this one are fixed
  size_t box_bytes = row_bytes;
  while (box_bytes > kCheckedBytes && box_from_dim + 1 < space_rank) {
    box_bytes /= static_cast<size_t>(std::max<int64_t>(row_shape[box_from_dim], 1));
    ++box_from_dim;
  }
  std::vector<std::byte> ours(row_bytes);
  std::vector<std::byte> theirs(box_bytes);
  for (const int64_t row : {int64_t{0}, rows - 1}) {
    bool our_ok = true;
    try {
      read_row(row, ours, nullptr);
    } catch (const Error&) {
      our_ok = false;
    }
    const bool their_ok = library_read_locked(dset, row, box_from_dim, theirs, nullptr);
    const size_t at = row == 0 ? 0 : row_bytes - box_bytes;
    if (our_ok == their_ok &&
        (!our_ok || std::memcmp(ours.data() + at, theirs.data(), box_bytes) == 0)) {
      continue;
    }
    read_path = Hdf5ReadPath::kLibrary;
    library_reason = "leanloader's own read of row " + std::to_string(row) +
                     (our_ok ? std::string(their_ok ? " differed from" : " succeeded where")
                             : std::string(" failed where")) +
                     " H5Dread" + (their_ok ? "" : " failed");
    return;
  }
}

Hdf5Dataset::~Hdf5Dataset() {
  // A forked child must not touch the library state it inherited mid-flight.
  if (::getpid() != owner_pid) return;
  Hdf5Lock lock;
  files->library.forget(this);
  if (memory_type >= 0) hdf5_api().t_close(memory_type);
}

std::string Hdf5Dataset::where(int64_t row) const {
  return "'" + path + "' dataset '" + name + "' row " + std::to_string(row);
}

void Hdf5Dataset::read_row(int64_t row, std::span<std::byte> dst, ChunkCache* cache) const {
  try {
    switch (read_path) {
      case Hdf5ReadPath::kPread:
        files->data.get(data_key)->read_exact(offset + static_cast<size_t>(row) * row_bytes, dst);
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
  Hdf5Lock lock;
  const hid_t dset = files->library.dataset(*this);
  std::string cause;
  if (!library_read_locked(dset, row, 0, dst, &cause)) {
    throw FormatError(
        where(row) + ": H5Dread failed (" + cause +
        "); this dataset is read through the HDF5 library because " +
        (library_reason.empty() ? std::string("a chunk was never written") : library_reason));
  }
}

size_t Hdf5Dataset::raw_chunk_bytes() const {
  if (read_path != Hdf5ReadPath::kChunks) return 0;
  const size_t destination = chunk_is_row ? row_bytes : chunk_bytes;
  size_t largest = 0;
  for (const Hdf5ChunkLocation& location : chunks) {
    // (decode_into reads an unfiltered chunk of the destination's size straight into it)
    const bool straight =
        (filters.empty() ||
         (filters.size() < 32 && location.filter_mask == (uint32_t{1} << filters.size()) - 1)) &&
        location.size == destination;
    if (!straight && !is_undefined(location.address)) largest = std::max(largest, location.size);
  }
  return largest;
}

size_t Hdf5Dataset::library_chunk_bytes() const {
  if (read_path != Hdf5ReadPath::kLibrary || chunk_bytes == 0) return 0;
  return checked_mul(chunk_bytes, size_t{3}).value_or(SIZE_MAX);
}

size_t Hdf5Dataset::decoded_chunk_bytes() const {
  return read_path == Hdf5ReadPath::kChunks && !chunk_is_row ? chunk_bytes : 0;
}

std::span<const std::byte> Hdf5Dataset::read_raw(const File& reader, size_t chunk, int64_t row,
                                                 std::vector<std::byte>& buffer) const {
  const Hdf5ChunkLocation& location = chunks[chunk];
  if (!range_fits(location.address, location.size, reader.size())) {
    throw FormatError(where(row) + ": chunk " + std::to_string(chunk) + " (" +
                      std::to_string(location.size) + " bytes at offset " +
                      std::to_string(location.address) + ") runs past the end of the file (" +
                      std::to_string(reader.size()) + " bytes): truncated or corrupt");
  }
  if (buffer.size() < location.size) buffer.resize(location.size);
  const std::span<std::byte> raw(buffer.data(), location.size);
  reader.read_exact(location.address, raw);
  return raw;
}

void Hdf5Dataset::decode_into(size_t chunk, int64_t row, std::span<std::byte> dst) const {
  const Hdf5ChunkLocation& location = chunks[chunk];
  const auto reader = files->data.get(data_key);
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
      read_raw(*reader, chunk, row, location.size <= kKeptBufferBytes ? kept : local);
  try {
    decode_chunk_into(raw, filters, location.filter_mask, dst, cell_bytes);
  } catch (const Error& e) {
    throw Error(where(row) + ": chunk " + std::to_string(chunk) + " at offset " +
                    std::to_string(location.address) + ": " + e.what(),
                e.kind(), e.error_number());
  }
}

std::shared_ptr<const HeapStorage> Hdf5Dataset::load_chunk(size_t chunk, int64_t row,
                                                           ChunkCache* cache) const {
  const bool shared = cache != nullptr && chunk_shape[0] > 1 && chunk_bytes <= cache->budget() / 4;
  if (shared) {
    if (auto hit = cache->find(this, chunk)) return hit;
  }
  // (HeapStorage maps a chunk of 1 MiB or more on its own and unmaps it when
  // the last reader lets go: freed chunks do not stay in malloc's arenas,
  // which glibc's dynamic mmap threshold would otherwise let them do)
  std::shared_ptr<HeapStorage> decoded = HeapStorage::allocate(chunk_bytes);
  decode_into(chunk, row, std::span<std::byte>(decoded->data(), chunk_bytes));
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

std::shared_ptr<const HeapStorage> ChunkCache::find(const void* owner, size_t chunk) {
  std::lock_guard lock(mutex_);
  const auto found = entries_.find({owner, chunk});
  if (found == entries_.end()) return nullptr;
  order_.splice(order_.begin(), order_, found->second);
  return found->second->data;
}

void ChunkCache::insert(const void* owner, size_t chunk, std::shared_ptr<const HeapStorage> data) {
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

void ChunkCache::clear() {
  std::lock_guard lock(mutex_);
  entries_.clear();
  order_.clear();
  bytes_ = 0;
}

size_t ChunkCache::bytes() const {
  std::lock_guard lock(mutex_);
  return bytes_;
}

}  // namespace leanloader::detail
