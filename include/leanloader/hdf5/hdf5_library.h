// Which HDF5 library the process reads with, chosen at run time.
//
// leanloader reaches HDF5 through a table of the C functions it uses,
// resolved with dlsym from one library loaded at run time: the build needs no
// HDF5 headers, and the process holds one HDF5. Chosen, in order:
// 1. the library an already loaded object links (use_hdf5_library_of():
//    Python passes h5py's extension, so files the newest h5py writes open and
//    the filters `import hdf5plugin` or HDF5_PLUGIN_PATH registered with it
//    serve leanloader's reads too);
// 2. $LEANLOADER_HDF5_LIBRARY, a path or soname;
// 3. a libhdf5 already loaded in the process;
// 4. the system's (Debian: libhdf5_serial.so.103), newest soname first.
// The oldest HDF5 supported is 1.10.5 (H5Dget_chunk_info_by_coord); see
// docs/ARCHITECTURE.md for what differs by version.
//
// Every call into the library holds one lock: h5py's own when the library is
// shared with h5py (set_hdf5_library_lock; h5py's HDF5 is not built
// thread-safe and h5py serialises its calls with that lock), else
// leanloader's mutex.
#pragma once

#include <string>

namespace leanloader {

struct Hdf5LibraryInfo {
  std::string path;  // the file the library was loaded from
  unsigned major = 0, minor = 0, release = 0;
  bool threadsafe = false;
  std::string chosen_because;  // which rule above picked it
};

// Chooses the HDF5 library that the loaded shared object `object_path` (e.g.
// h5py's defs extension) resolves H5open to, when none is in use yet (the
// first choice stays: one HDF5 per process); otherwise, or when the object is
// not loaded, the rules above. Returns the library in use; `*shared` says
// whether it is the object's. Throws Error when no library loads.
Hdf5LibraryInfo use_hdf5_library_of(const std::string& object_path, bool* shared = nullptr);

// The library in use, loading it by the rules above on first call. Throws
// Error naming every place tried when none loads or one lacks a function.
Hdf5LibraryInfo hdf5_library_info();

// The lock every call into HDF5 takes instead of leanloader's own mutex
// (h5py's, when the library is h5py's). `lock` and `unlock` run on the
// calling thread and may be called with or without the GIL; set it before
// the first source opens.
void set_hdf5_library_lock(void (*lock)(void*), void (*unlock)(void*), void* context);

}  // namespace leanloader
