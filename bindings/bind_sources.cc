// Sources: ArraySource over the caller's arrays (no copy), NpySource,
// FileSource.
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "leanloader/sources/array_source.h"
#include "leanloader/sources/file_source.h"
#include "leanloader/sources/npy_source.h"

namespace nb = nanobind;

namespace leanloader::bindings {

namespace {

nb::list fields_of(const Source& source) {
  nb::list fields;
  for (const FieldSpec& field : source.fields()) {
    nb::object shape = nb::none();
    if (field.shape) shape = nb::cast(*field.shape);
    fields.append(nb::make_tuple(field.name, std::string(dtype_name(field.dtype)), shape));
  }
  return fields;
}

}  // namespace

void bind_sources(nb::module_& m) {
  nb::class_<Source>(m, "Source", "Where samples come from: a count and named fields per sample.")
      .def("__len__", &Source::size)
      .def_prop_ro("fields", &fields_of,
                   "List of (name, dtype, per-sample shape or None when it varies).")
      .def("describe", &Source::describe)
      .def("sample_location", &Source::sample_location, nb::arg("index"))
      .def_prop_ro("per_thread_scratch_bytes", &Source::per_thread_scratch_bytes,
                   "Bytes one reading thread may hold besides the batch (a stored and a decoded "
                   "chunk, an image's file bytes and decoded pixels); Loader.memory_bill() counts "
                   "them per thread.")
      .def("__repr__", &Source::describe);

  nb::class_<ArraySource, Source>(m, "ArraySource")
      .def(
          "__init__",
          [](ArraySource* self, const std::vector<std::pair<std::string, InputArray>>& arrays) {
            std::vector<ArraySource::Field> fields;
            for (const auto& [name, array] : arrays)
              fields.push_back({name, tensor_view_of(array, name, ArrayLifetime::kShared)});
            new (self) ArraySource(std::move(fields));
          },
          nb::arg("arrays"), "Samples are rows of the given arrays, viewed without copying.");

  nb::class_<NpySource, Source>(m, "NpySource")
      .def_static("from_arrays", &NpySource::from_arrays, nb::arg("fields"),
                  "One memory-mapped .npy per field; row i of each is sample i.")
      .def_static("from_directory", &NpySource::from_directory, nb::arg("field_name"),
                  nb::arg("directory"), "One .npy file per sample, sorted by name.");

  nb::class_<FileSource, Source>(m, "FileSource")
      .def(nb::init<std::vector<std::string>>(), nb::arg("paths"),
           "Each sample is the raw bytes of one file (field 'data', U8).")
      .def_prop_ro("paths", &FileSource::paths);
}

}  // namespace leanloader::bindings
