// HDF5Source: (name, files, dataset, optional index array) per field.
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <tuple>

#include "bindings.h"
#include "leanloader/hdf5/hdf5_source.h"

namespace nb = nanobind;

namespace leanloader::bindings {

namespace {

using IndexArray = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using FieldTuple = std::tuple<std::string, std::string, std::string, std::optional<IndexArray>>;

std::shared_ptr<HDF5Source> open_source(const std::vector<FieldTuple>& tuples,
                                        size_t chunk_cache_bytes) {
  std::vector<HDF5Field> fields;
  for (const auto& [name, files, dataset, index] : tuples) {
    HDF5Field field{name, files, dataset, std::nullopt};
    if (index) field.index.emplace(index->data(), index->data() + index->shape(0));
    fields.push_back(std::move(field));
  }
  nb::gil_scoped_release release;  // opening reads the files
  return HDF5Source::open(std::move(fields), HDF5SourceOptions{chunk_cache_bytes});
}

}  // namespace

void bind_hdf5(nb::module_& m) {
  nb::class_<HDF5Source, Source>(m, "HDF5Source")
      .def_static("open", &open_source, nb::arg("fields"), nb::arg("chunk_cache_bytes"),
                  "Fields as (name, file or glob, dataset, index array or None).")
      .def("files", &HDF5Source::files, nb::arg("field"))
      .def("layout", &HDF5Source::layout, nb::arg("field"),
           "How each file of the field is read: pread, chunks, memory or library: <why>.")
      .def_prop_ro("chunk_cache_budget", &HDF5Source::chunk_cache_budget)
      .def_prop_ro("chunk_cache_bytes", &HDF5Source::chunk_cache_bytes)
      .def_static("library_threadsafe", &HDF5Source::library_threadsafe);
}

}  // namespace leanloader::bindings
