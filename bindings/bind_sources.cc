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
#include "leanloader/array_source.h"
#include "leanloader/file_source.h"
#include "leanloader/npy_source.h"

namespace nb = nanobind;

namespace leanloader::bindings {

namespace {

using CpuArray = nb::ndarray<nb::ro, nb::device::cpu>;

bool interpreter_is_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}

// A Tensor viewing the caller's array. The Storage keeps a reference to the
// array; it is dropped with the GIL held from whichever thread releases the
// last view. At interpreter exit the reference is left to the OS.
Tensor view_of(const CpuArray& array, const std::string& name) {
  const auto dtype = dtype_from_dlpack({array.dtype().code, array.dtype().bits});
  if (!dtype.has_value() || array.dtype().lanes != 1) {
    throw nb::type_error(("array '" + name + "' has a dtype leanloader does not handle").c_str());
  }
  Shape shape, strides;
  size_t last_byte = 0;
  for (size_t i = 0; i < array.ndim(); ++i) {
    shape.push_back(static_cast<int64_t>(array.shape(i)));
    strides.push_back(array.stride(i));
    if (array.stride(i) < 0) {
      throw nb::value_error(
          ("array '" + name + "' has negative strides; pass a copy (np.ascontiguousarray)")
              .c_str());
    }
    if (array.shape(i) > 0)
      last_byte += (array.shape(i) - 1) * static_cast<size_t>(array.stride(i));
  }
  const size_t extent = array.size() == 0 ? 0 : (last_byte + 1) * dtype_size(*dtype);
  auto* keep_alive = new CpuArray(array);
  auto storage = std::make_shared<ExternalStorage>(
      static_cast<std::byte*>(const_cast<void*>(array.data())), extent, [keep_alive] {
        if (!Py_IsInitialized() || interpreter_is_finalizing()) return;
        nb::gil_scoped_acquire gil;
        delete keep_alive;
      });
  return Tensor(std::move(storage), 0, *dtype, std::move(shape), std::move(strides));
}

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
      .def("__repr__", &Source::describe);

  nb::class_<ArraySource, Source>(m, "ArraySource")
      .def(
          "__init__",
          [](ArraySource* self, const std::vector<std::pair<std::string, CpuArray>>& arrays) {
            std::vector<ArraySource::Field> fields;
            for (const auto& [name, array] : arrays) fields.push_back({name, view_of(array, name)});
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
