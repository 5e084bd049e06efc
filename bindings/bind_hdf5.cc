// HDF5Source: (name, files, dataset, optional index array) per field.
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <tuple>

#include "bindings.h"
#include "leanloader/hdf5/hdf5_library.h"
#include "leanloader/hdf5/hdf5_source.h"

namespace nb = nanobind;

namespace leanloader::bindings {

namespace {

using IndexArray = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using FieldTuple = std::tuple<std::string, std::string, std::string, std::optional<IndexArray>>;

std::shared_ptr<HDF5Source> open_source(const std::vector<FieldTuple>& tuples,
                                        size_t chunk_cache_bytes, size_t max_open_files) {
  std::vector<HDF5Field> fields;
  for (const auto& [name, files, dataset, index] : tuples) {
    HDF5Field field{name, files, dataset, std::nullopt};
    if (index) field.index.emplace(index->data(), index->data() + index->shape(0));
    fields.push_back(std::move(field));
  }
  nb::gil_scoped_release release;  // opening reads the files
  return HDF5Source::open(std::move(fields), HDF5SourceOptions{chunk_cache_bytes, max_open_files});
}

// h5py's lock (h5py._objects.phil), taken around every call into the HDF5
// library it shares with leanloader. A FastRLock: acquired and released with
// the GIL held, held across GIL releases. Kept for the process's life.
nb::object* shared_library_lock = nullptr;

void acquire_shared_lock(void*) {
  nb::gil_scoped_acquire gil;
  shared_library_lock->attr("acquire")();
}

void release_shared_lock(void*) {
  nb::gil_scoped_acquire gil;
  shared_library_lock->attr("release")();
}

nb::dict library_dict(const Hdf5LibraryInfo& info) {
  nb::dict out;
  out["path"] = info.path;
  out["version"] = nb::make_tuple(info.major, info.minor, info.release);
  out["threadsafe"] = info.threadsafe;
  out["chosen_because"] = info.chosen_because;
  return out;
}

}  // namespace

void bind_hdf5(nb::module_& m) {
  nb::class_<HDF5Source, Source>(m, "HDF5Source")
      .def_static("open", &open_source, nb::arg("fields"), nb::arg("chunk_cache_bytes"),
                  nb::arg("max_open_files") = 0,
                  "Fields as (name, file or glob, dataset, index array or None).")
      .def_prop_ro("open_file_budget", &HDF5Source::open_file_budget)
      .def_prop_ro("open_file_count", &HDF5Source::open_file_count)
      .def("files", &HDF5Source::files, nb::arg("field"))
      .def("layout", &HDF5Source::layout, nb::arg("field"),
           "How each file of the field is read: pread, chunks, memory or library: <why>.")
      .def_prop_ro("chunk_cache_budget", &HDF5Source::chunk_cache_budget)
      .def_prop_ro("chunk_cache_bytes", &HDF5Source::chunk_cache_bytes)
      .def_static("library_threadsafe", &HDF5Source::library_threadsafe);
  m.def(
      "use_hdf5_library_of",
      [](const std::string& object_path, nb::object lock) {
        bool shared = false;
        const Hdf5LibraryInfo info = use_hdf5_library_of(object_path, &shared);
        if (!lock.is_none() && shared_library_lock == nullptr && shared) {
          shared_library_lock = new nb::object(std::move(lock));
          set_hdf5_library_lock(acquire_shared_lock, release_shared_lock, nullptr);
        }
        nb::dict out = library_dict(info);
        out["shared_with_object"] = shared;
        return out;
      },
      nb::arg("object_path"), nb::arg("lock").none(),
      "Reads HDF5 with the library that object links (h5py's), taking `lock` (h5py's) around "
      "every call into it.");
  m.def("hdf5_library_info", [] { return library_dict(hdf5_library_info()); });
}

}  // namespace leanloader::bindings
