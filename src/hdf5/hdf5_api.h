// The part of the HDF5 C API leanloader calls, declared here and resolved at
// run time from the library hdf5_library_info() describes. Internal.
//
// The types and constants are the C API's own; they have been the same on
// x86-64 and aarch64 Linux from HDF5 1.10 to 2.0 (hid_t 64-bit since 1.10).
// Functions whose names changed are looked up under each name
// (H5Dread_chunk2 in 2.0, H5Dread_chunk before).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace leanloader::detail {

using hid_t = int64_t;
using herr_t = int;
using htri_t = int;
using hsize_t = unsigned long long;
using haddr_t = uint64_t;

inline constexpr hid_t kH5Default = 0;  // H5P_DEFAULT, H5S_ALL, H5E_DEFAULT
inline constexpr unsigned kH5FAccRdonly = 0;
inline constexpr haddr_t kHaddrUndef = ~haddr_t{0};
inline constexpr int kH5TOrderLe = 0;
inline constexpr int kH5TSgn2 = 1;
inline constexpr int kH5TNormImplied = 0;  // IEEE: the mantissa's leading 1 is not stored
inline constexpr int kH5SSimple = 1;
inline constexpr int kH5SSelectSet = 0;
inline constexpr int kH5EWalkDownward = 1;
inline constexpr unsigned kH5DChunkDontFilterPartialChunks = 0x0002;

enum class H5TClass : int {
  kInteger = 0,
  kFloat = 1,
  kTime = 2,
  kString = 3,
  kBitfield = 4,
  kOpaque = 5,
  kCompound = 6,
  kReference = 7,
  kEnum = 8,
  kVlen = 9,
  kArray = 10,
  kComplex = 11,  // HDF5 2.0
};

enum class H5DLayout : int { kCompact = 0, kContiguous = 1, kChunked = 2, kVirtual = 3 };

struct H5EError2 {
  hid_t cls_id;
  hid_t maj_num;
  hid_t min_num;
  unsigned line;
  const char* func_name;
  const char* file_name;
  const char* desc;
};
using H5EWalk2 = herr_t (*)(unsigned, const H5EError2*, void*);

// The functions, resolved once; `read_chunk_has_size` says which signature
// read_chunk has (2.0's H5Dread_chunk2 takes the buffer's size).
struct Hdf5Api {
  herr_t (*open)();
  herr_t (*get_libversion)(unsigned*, unsigned*, unsigned*);
  herr_t (*is_library_threadsafe)(bool*);
  herr_t (*free_memory)(void*);
  herr_t (*e_set_auto2)(hid_t, void*, void*);
  herr_t (*e_walk2)(hid_t, int, H5EWalk2, void*);
  herr_t (*e_clear2)(hid_t);
  hid_t (*f_open)(const char*, unsigned, hid_t);
  herr_t (*f_close)(hid_t);
  ssize_t (*f_get_name)(hid_t, char*, size_t);
  hid_t (*f_get_create_plist)(hid_t);
  hid_t (*i_get_file_id)(hid_t);
  htri_t (*l_exists)(hid_t, const char*, hid_t);
  hid_t (*d_open2)(hid_t, const char*, hid_t);
  herr_t (*d_close)(hid_t);
  hid_t (*d_get_type)(hid_t);
  hid_t (*d_get_space)(hid_t);
  hid_t (*d_get_create_plist)(hid_t);
  haddr_t (*d_get_offset)(hid_t);
  herr_t (*d_get_chunk_info_by_coord)(hid_t, const hsize_t*, unsigned*, haddr_t*, hsize_t*);
  herr_t (*d_read)(hid_t, hid_t, hid_t, hid_t, hid_t, void*);
  void* d_read_chunk;  // see read_chunk()
  bool read_chunk_has_size = false;
  int (*p_get_layout)(hid_t);
  int (*p_get_chunk)(hid_t, int, hsize_t*);
  herr_t (*p_get_chunk_opts)(hid_t, unsigned*);
  int (*p_get_nfilters)(hid_t);
  int (*p_get_filter2)(hid_t, unsigned, unsigned*, size_t*, unsigned*, size_t, char*, unsigned*);
  int (*p_get_external_count)(hid_t);
  herr_t (*p_get_userblock)(hid_t, hsize_t*);
  herr_t (*p_close)(hid_t);
  hid_t (*s_create_simple)(int, const hsize_t*, const hsize_t*);
  int (*s_get_simple_extent_ndims)(hid_t);
  int (*s_get_simple_extent_dims)(hid_t, hsize_t*, hsize_t*);
  int (*s_get_simple_extent_type)(hid_t);
  herr_t (*s_select_hyperslab)(hid_t, int, const hsize_t*, const hsize_t*, const hsize_t*,
                               const hsize_t*);
  herr_t (*s_close)(hid_t);
  hid_t (*t_copy)(hid_t);
  herr_t (*t_close)(hid_t);
  int (*t_get_class)(hid_t);
  size_t (*t_get_size)(hid_t);
  int (*t_get_order)(hid_t);
  size_t (*t_get_precision)(hid_t);
  int (*t_get_offset)(hid_t);
  int (*t_get_sign)(hid_t);
  herr_t (*t_get_fields)(hid_t, size_t*, size_t*, size_t*, size_t*, size_t*);
  size_t (*t_get_ebias)(hid_t);
  int (*t_get_norm)(hid_t);  // H5T_norm_t: kH5TNormImplied, ...
  herr_t (*t_set_norm)(hid_t, int);
  herr_t (*t_set_size)(hid_t, size_t);
  herr_t (*t_get_member_value)(hid_t, unsigned, void*);
  hid_t (*t_get_super)(hid_t);
  int (*t_get_array_ndims)(hid_t);
  int (*t_get_array_dims)(hid_t, hsize_t*);                  // H5Tget_array_dims2
  hid_t (*t_array_create)(hid_t, unsigned, const hsize_t*);  // H5Tarray_create2
  int (*t_get_nmembers)(hid_t);
  char* (*t_get_member_name)(hid_t, unsigned);
  hid_t (*t_get_member_type)(hid_t, unsigned);
  size_t (*t_get_member_offset)(hid_t, unsigned);
  herr_t (*t_set_order)(hid_t, int);
  herr_t (*t_set_precision)(hid_t, size_t);
  herr_t (*t_set_offset)(hid_t, size_t);
  htri_t (*z_filter_avail)(int);

  // H5Dread_chunk under either signature: the chunk at `offset` as stored,
  // into `buffer` of `size` bytes.
  herr_t read_chunk(hid_t dataset, const hsize_t* offset, uint32_t* filter_mask, void* buffer,
                    size_t size) const;
};

// The table of the library in use (loaded on first call; throws Error).
const Hdf5Api& hdf5_api();

// Holds the process-wide HDF5 lock: the external lock set with
// set_hdf5_library_lock (h5py's) when there is one, else leanloader's mutex.
// Re-entrant on one thread. Turns off
// the library's printing of errors for this thread (thread-safe builds keep
// that setting per thread).
class Hdf5Lock {
 public:
  Hdf5Lock();
  ~Hdf5Lock();
  Hdf5Lock(const Hdf5Lock&) = delete;
  Hdf5Lock& operator=(const Hdf5Lock&) = delete;
};

// The library's account of the last failure on this thread, deepest cause
// first ("required filter 'blosc' is not registered (in H5Dread: can't read
// data)"), then cleared. The caller holds Hdf5Lock.
std::string hdf5_error_stack_locked();

}  // namespace leanloader::detail
