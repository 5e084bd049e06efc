#include "leanloader/hdf5/hdf5_library.h"

#include <dlfcn.h>
#include <link.h>

#include <climits>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "hdf5/hdf5_api.h"
#include "leanloader/core/error.h"

namespace leanloader {

namespace detail {

namespace {

struct ExternalLock {
  void (*lock)(void*) = nullptr;
  void (*unlock)(void*) = nullptr;
  void* context = nullptr;
};

struct LoadedLibrary {
  void* handle = nullptr;
  Hdf5Api api{};
  Hdf5LibraryInfo info;
};

std::mutex& library_mutex() {
  static std::mutex mutex;
  return mutex;
}

// Guarded by library_mutex().
LoadedLibrary*& loaded() {
  static LoadedLibrary* library = nullptr;
  return library;
}

// Set once (under hdf5_lock_mutex()) before the library's first use.
ExternalLock& external_lock() {
  static ExternalLock lock;
  return lock;
}

std::mutex& hdf5_lock_mutex() {
  static std::mutex mutex;
  return mutex;
}

template <typename Function>
bool resolve(void* handle, const char* name, Function& out, std::string& missing) {
  out = reinterpret_cast<Function>(::dlsym(handle, name));
  if (out == nullptr) missing += (missing.empty() ? "" : ", ") + std::string(name);
  return out != nullptr;
}

// Resolves every function; on success the library is initialised (H5open).
std::string fill_table(void* handle, Hdf5Api& api) {
  std::string missing;
  resolve(handle, "H5open", api.open, missing);
  resolve(handle, "H5get_libversion", api.get_libversion, missing);
  resolve(handle, "H5is_library_threadsafe", api.is_library_threadsafe, missing);
  resolve(handle, "H5free_memory", api.free_memory, missing);
  resolve(handle, "H5Eset_auto2", api.e_set_auto2, missing);
  resolve(handle, "H5Ewalk2", api.e_walk2, missing);
  resolve(handle, "H5Eclear2", api.e_clear2, missing);
  resolve(handle, "H5Fopen", api.f_open, missing);
  resolve(handle, "H5Fclose", api.f_close, missing);
  resolve(handle, "H5Fget_name", api.f_get_name, missing);
  resolve(handle, "H5Fget_create_plist", api.f_get_create_plist, missing);
  resolve(handle, "H5Iget_file_id", api.i_get_file_id, missing);
  resolve(handle, "H5Lexists", api.l_exists, missing);
  resolve(handle, "H5Dopen2", api.d_open2, missing);
  resolve(handle, "H5Dclose", api.d_close, missing);
  resolve(handle, "H5Dget_type", api.d_get_type, missing);
  resolve(handle, "H5Dget_space", api.d_get_space, missing);
  resolve(handle, "H5Dget_create_plist", api.d_get_create_plist, missing);
  resolve(handle, "H5Dget_offset", api.d_get_offset, missing);
  resolve(handle, "H5Dget_chunk_info_by_coord", api.d_get_chunk_info_by_coord, missing);
  resolve(handle, "H5Dread", api.d_read, missing);
  api.d_read_chunk = ::dlsym(handle, "H5Dread_chunk2");
  api.read_chunk_has_size = api.d_read_chunk != nullptr;
  if (api.d_read_chunk == nullptr) api.d_read_chunk = ::dlsym(handle, "H5Dread_chunk");
  if (api.d_read_chunk == nullptr) api.d_read_chunk = ::dlsym(handle, "H5Dread_chunk1");
  if (api.d_read_chunk == nullptr) missing += ", H5Dread_chunk";
  resolve(handle, "H5Pget_layout", api.p_get_layout, missing);
  resolve(handle, "H5Pget_chunk", api.p_get_chunk, missing);
  resolve(handle, "H5Pget_chunk_opts", api.p_get_chunk_opts, missing);
  resolve(handle, "H5Pget_nfilters", api.p_get_nfilters, missing);
  resolve(handle, "H5Pget_filter2", api.p_get_filter2, missing);
  resolve(handle, "H5Pget_external_count", api.p_get_external_count, missing);
  resolve(handle, "H5Pget_userblock", api.p_get_userblock, missing);
  resolve(handle, "H5Pclose", api.p_close, missing);
  resolve(handle, "H5Screate_simple", api.s_create_simple, missing);
  resolve(handle, "H5Sget_simple_extent_ndims", api.s_get_simple_extent_ndims, missing);
  resolve(handle, "H5Sget_simple_extent_dims", api.s_get_simple_extent_dims, missing);
  resolve(handle, "H5Sget_simple_extent_type", api.s_get_simple_extent_type, missing);
  resolve(handle, "H5Sselect_hyperslab", api.s_select_hyperslab, missing);
  resolve(handle, "H5Sclose", api.s_close, missing);
  resolve(handle, "H5Tcopy", api.t_copy, missing);
  resolve(handle, "H5Tclose", api.t_close, missing);
  resolve(handle, "H5Tget_class", api.t_get_class, missing);
  resolve(handle, "H5Tget_size", api.t_get_size, missing);
  resolve(handle, "H5Tget_order", api.t_get_order, missing);
  resolve(handle, "H5Tget_precision", api.t_get_precision, missing);
  resolve(handle, "H5Tget_offset", api.t_get_offset, missing);
  resolve(handle, "H5Tget_sign", api.t_get_sign, missing);
  resolve(handle, "H5Tget_fields", api.t_get_fields, missing);
  resolve(handle, "H5Tget_ebias", api.t_get_ebias, missing);
  resolve(handle, "H5Tget_norm", api.t_get_norm, missing);
  resolve(handle, "H5Tset_norm", api.t_set_norm, missing);
  resolve(handle, "H5Tset_size", api.t_set_size, missing);
  resolve(handle, "H5Tget_member_value", api.t_get_member_value, missing);
  resolve(handle, "H5Tget_super", api.t_get_super, missing);
  resolve(handle, "H5Tget_array_ndims", api.t_get_array_ndims, missing);
  resolve(handle, "H5Tget_array_dims2", api.t_get_array_dims, missing);
  resolve(handle, "H5Tarray_create2", api.t_array_create, missing);
  resolve(handle, "H5Tget_nmembers", api.t_get_nmembers, missing);
  resolve(handle, "H5Tget_member_name", api.t_get_member_name, missing);
  resolve(handle, "H5Tget_member_type", api.t_get_member_type, missing);
  resolve(handle, "H5Tget_member_offset", api.t_get_member_offset, missing);
  resolve(handle, "H5Tset_order", api.t_set_order, missing);
  resolve(handle, "H5Tset_precision", api.t_set_precision, missing);
  resolve(handle, "H5Tset_offset", api.t_set_offset, missing);
  resolve(handle, "H5Zfilter_avail", api.z_filter_avail, missing);
  return missing;
}

std::string path_of(void* address) {
  Dl_info info{};
  if (address != nullptr && ::dladdr(address, &info) != 0 && info.dli_fname != nullptr) {
    return info.dli_fname;
  }
  return {};
}

// Loads `name` (a path or soname), fills the table and checks the version;
// empty on success, else why not.
std::string try_load(const std::string& name, const std::string& because, int extra_flags) {
  void* handle = ::dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL | extra_flags);
  if (handle == nullptr) {
    const char* error = ::dlerror();
    return name + ": " + (error != nullptr ? error : "cannot be loaded");
  }
  auto library = std::make_unique<LoadedLibrary>();
  library->handle = handle;
  const std::string missing = fill_table(handle, library->api);
  if (!missing.empty()) {
    ::dlclose(handle);
    return name + ": lacks " + missing + " (leanloader needs HDF5 1.10.5 or newer)";
  }
  Hdf5Api& api = library->api;
  api.open();
  api.get_libversion(&library->info.major, &library->info.minor, &library->info.release);
  bool threadsafe = false;
  api.is_library_threadsafe(&threadsafe);
  library->info.threadsafe = threadsafe;
  library->info.path = path_of(reinterpret_cast<void*>(api.open));
  if (library->info.path.empty()) library->info.path = name;
  library->info.chosen_because = because;
  loaded() = library.release();  // kept for the process's life, as the library is
  return {};
}

// A libhdf5 (not _hl, _cpp, _fortran) already mapped into the process.
std::string loaded_hdf5_path() {
  std::string found;
  ::dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) -> int {
        if (info->dlpi_name == nullptr) return 0;
        const std::string path = info->dlpi_name;
        const std::string base = path.substr(path.rfind('/') + 1);
        const bool is_hdf5 =
            base.rfind("libhdf5", 0) == 0 && base.size() > 7 &&
            (base[7] == '.' || base[7] == '-' || base.rfind("libhdf5_serial.", 0) == 0);
        if (is_hdf5) {
          *static_cast<std::string*>(data) = path;
          return 1;
        }
        return 0;
      },
      &found);
  return found;
}

void load_default_locked() {
  if (loaded() != nullptr) return;
  std::vector<std::string> tried;
  auto attempt = [&](const std::string& name, const std::string& because, int flags = 0) {
    std::string why = try_load(name, because, flags);
    if (!why.empty()) tried.push_back(std::move(why));
    return loaded() != nullptr;
  };
  if (const char* chosen = std::getenv("LEANLOADER_HDF5_LIBRARY"); chosen && *chosen) {
    if (attempt(chosen, "LEANLOADER_HDF5_LIBRARY")) return;
  }
  if (const std::string present = loaded_hdf5_path(); !present.empty()) {
    if (attempt(present, "already loaded in the process", RTLD_NOLOAD)) return;
  }
  for (const char* name :
       {"libhdf5.so.320", "libhdf5.so.310", "libhdf5.so.200", "libhdf5_serial.so.310",
        "libhdf5.so.103", "libhdf5_serial.so.103", "libhdf5.so", "libhdf5_serial.so"}) {
    if (attempt(name, "the system's")) return;
  }
  std::string text;
  for (const std::string& why : tried) text += "\n  " + why;
  throw Error(
      "no usable HDF5 library: install h5py (pip install h5py) or the system's "
      "(apt-get install libhdf5-103-1), or set LEANLOADER_HDF5_LIBRARY; tried:" +
      text);
}

herr_t collect_error(unsigned, const H5EError2* error, void* data) {
  auto* messages = static_cast<std::vector<std::string>*>(data);
  std::string text = error->desc != nullptr ? error->desc : "";
  if (text.empty()) return 0;
  if (error->func_name != nullptr && *error->func_name != '\0') {
    text += std::string(" (") + error->func_name + ")";
  }
  messages->push_back(std::move(text));
  return 0;
}

thread_local int lock_depth = 0;

}  // namespace

herr_t Hdf5Api::read_chunk(hid_t dataset, const hsize_t* offset, uint32_t* filter_mask,
                           void* buffer, size_t size) const {
  if (read_chunk_has_size) {
    using Read2 = herr_t (*)(hid_t, hid_t, const hsize_t*, uint32_t*, void*, size_t*);
    size_t in_out = size;
    return reinterpret_cast<Read2>(d_read_chunk)(dataset, kH5Default, offset, filter_mask, buffer,
                                                 &in_out);
  }
  using Read1 = herr_t (*)(hid_t, hid_t, const hsize_t*, uint32_t*, void*);
  return reinterpret_cast<Read1>(d_read_chunk)(dataset, kH5Default, offset, filter_mask, buffer);
}

const Hdf5Api& hdf5_api() {
  std::lock_guard lock(library_mutex());
  load_default_locked();
  return loaded()->api;
}

Hdf5Lock::Hdf5Lock() {
  if (lock_depth++ > 0) return;
  const Hdf5Api& api = hdf5_api();
  // With an external lock (h5py's) that lock alone serialises: taking our
  // mutex as well would deadlock a thread that holds the GIL and waits for
  // the mutex against one that holds the mutex and needs the GIL for h5py's
  // lock. The external lock is set before the first call and never changes.
  const ExternalLock& external = external_lock();
  if (external.lock != nullptr) {
    external.lock(external.context);
  } else {
    hdf5_lock_mutex().lock();
  }
  thread_local bool printing_off = false;
  if (!printing_off) {
    api.e_set_auto2(kH5Default, nullptr, nullptr);
    printing_off = true;
  }
}

Hdf5Lock::~Hdf5Lock() {
  if (--lock_depth > 0) return;
  const ExternalLock& external = external_lock();
  if (external.unlock != nullptr) {
    external.unlock(external.context);
  } else {
    hdf5_lock_mutex().unlock();
  }
}

std::string hdf5_error_stack_locked() {
  const Hdf5Api& api = hdf5_api();
  std::vector<std::string> messages;  // outermost (the API call) first
  api.e_walk2(kH5Default, kH5EWalkDownward, collect_error, &messages);
  api.e_clear2(kH5Default);
  if (messages.empty()) return "no detail from the HDF5 library";
  std::string text = messages.back();
  if (messages.size() > 1) text += ", in " + messages.front();
  return text;
}

}  // namespace detail

Hdf5LibraryInfo use_hdf5_library_of(const std::string& object_path, bool* shared) {
  std::lock_guard lock(detail::library_mutex());
  if (shared != nullptr) *shared = false;
  std::string library;
  if (void* object = ::dlopen(object_path.c_str(), RTLD_NOW | RTLD_NOLOAD | RTLD_LOCAL)) {
    // dlsym through the object's handle searches the object and what it links.
    library = detail::path_of(::dlsym(object, "H5open"));
    ::dlclose(object);
  }
  if (detail::loaded() == nullptr && !library.empty()) {
    detail::try_load(library, "linked by " + object_path, RTLD_NOLOAD);
  }
  detail::load_default_locked();
  const Hdf5LibraryInfo& info = detail::loaded()->info;
  if (shared != nullptr && !library.empty()) {
    char a[PATH_MAX], b[PATH_MAX];
    *shared = ::realpath(library.c_str(), a) != nullptr &&
              ::realpath(info.path.c_str(), b) != nullptr && std::string(a) == b;
  }
  return info;
}

Hdf5LibraryInfo hdf5_library_info() {
  std::lock_guard lock(detail::library_mutex());
  detail::load_default_locked();
  return detail::loaded()->info;
}

void set_hdf5_library_lock(void (*lock)(void*), void (*unlock)(void*), void* context) {
  std::lock_guard guard(detail::hdf5_lock_mutex());
  detail::external_lock() = {lock, unlock, context};
}

}  // namespace leanloader
