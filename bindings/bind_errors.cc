// Maps leanloader::Error kinds to Python exception types.
//
//   kGeneric          -> leanloader.Error (RuntimeError)
//   kFormat           -> leanloader.FormatError (ValueError)
//   kInvalidArgument  -> ValueError
//   kIo               -> OSError(errno, message)
//   kNotFound         -> FileNotFoundError(errno, message)
//   kOutOfMemory      -> MemoryError
//   kTimeout          -> TimeoutError
// A SampleError also carries sample_index, source, location and stage as
// attributes of the raised exception.
#include <Python.h>

#include "bindings.h"

namespace nb = nanobind;

namespace leanloader::bindings {

namespace {

PyObject* g_error_type = nullptr;
PyObject* g_format_error_type = nullptr;
PyObject* g_decompression_bomb_warning = nullptr;
// leanloader's DecompressionBombWarning deriving from Pillow's too, made
// the first time one is raised while PIL.Image is imported: a filter on
// Pillow's class then treats ours alike (a user who never imported Pillow
// cannot have such a filter, so Pillow is not imported for a warning). It
// is named leanloader.image._DecompressionBombWarningWithPillows, which that
// module's __getattr__ resolves, so that pickle (a warning turned error in a
// worker process) finds it in any process.
PyObject* g_decompression_bomb_warning_and_pillows = nullptr;

PyObject* with_pillows_warning(bool import_pillow) {
  if (g_decompression_bomb_warning_and_pillows != nullptr) {
    return g_decompression_bomb_warning_and_pillows;
  }
  const nb::object image =
      nb::steal(import_pillow ? PyImport_ImportModule("PIL.Image")
                              : PyImport_GetModule(nb::str("PIL.Image").ptr()));
  if (!image.is_valid()) {
    PyErr_Clear();  // not imported (or no Pillow): ours alone
    return nullptr;
  }
  const nb::object pillows =
      nb::steal(PyObject_GetAttrString(image.ptr(), "DecompressionBombWarning"));
  if (!pillows.is_valid() || !PyType_Check(pillows.ptr()) ||
      !PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(pillows.ptr()),
                        reinterpret_cast<PyTypeObject*>(PyExc_RuntimeWarning))) {
    PyErr_Clear();  // a Pillow without it (or a stand-in module): ours alone
    return nullptr;
  }
  const nb::object bases = nb::steal(PyTuple_Pack(2, g_decompression_bomb_warning, pillows.ptr()));
  if (!bases.is_valid()) {
    PyErr_Clear();
    return nullptr;
  }
  g_decompression_bomb_warning_and_pillows = PyErr_NewExceptionWithDoc(
      "leanloader.image._DecompressionBombWarningWithPillows",
      "leanloader.DecompressionBombWarning that is Pillow's DecompressionBombWarning as well.",
      bases.ptr(), nullptr);
  if (g_decompression_bomb_warning_and_pillows == nullptr) PyErr_Clear();
  return g_decompression_bomb_warning_and_pillows;
}

PyObject* python_type_for(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kFormat:
      return g_format_error_type;
    case ErrorKind::kInvalidArgument:
      return PyExc_ValueError;
    case ErrorKind::kIo:
      return PyExc_OSError;
    case ErrorKind::kNotFound:
      return PyExc_FileNotFoundError;
    case ErrorKind::kOutOfMemory:
      return PyExc_MemoryError;
    case ErrorKind::kTimeout:
      return PyExc_TimeoutError;
    case ErrorKind::kGeneric:
      break;
  }
  return g_error_type;
}

void set_python_error(const Error& error) {
  PyObject* type = python_type_for(error.kind());
  nb::object instance;
  if ((error.kind() == ErrorKind::kIo || error.kind() == ErrorKind::kNotFound) &&
      error.error_number() != 0) {
    instance = nb::steal(PyObject_CallFunction(type, "is", error.error_number(), error.what()));
  } else {
    instance = nb::steal(PyObject_CallFunction(type, "s", error.what()));
  }
  if (!instance.is_valid()) return;  // constructing the exception failed; that error is set
  if (const auto* sample = dynamic_cast<const SampleError*>(&error)) {
    nb::setattr(instance, "sample_index", nb::int_(sample->sample_index()));
    nb::setattr(instance, "source", nb::str(sample->source().c_str()));
    nb::setattr(instance, "location", nb::str(sample->location().c_str()));
    nb::setattr(instance, "stage", nb::str(sample->stage().c_str()));
  }
  PyErr_SetObject(type, instance.ptr());
}

}  // namespace

void raise_python_error(const Error& error) {
  set_python_error(error);
  throw nb::python_error();
}

PyObject* warning_category(WarningKind kind) {
  if (kind != WarningKind::kPixelLimit) return PyExc_RuntimeWarning;
  PyObject* with_pillows = with_pillows_warning(/*import_pillow=*/false);
  return with_pillows != nullptr ? with_pillows : g_decompression_bomb_warning;
}

void bind_errors(nb::module_& m) {
  g_error_type = PyErr_NewExceptionWithDoc(
      "leanloader.Error", "Base class of leanloader's own errors.", PyExc_RuntimeError, nullptr);
  g_format_error_type = PyErr_NewExceptionWithDoc(
      "leanloader.FormatError",
      "Malformed bytes in a file leanloader reads; the message names the file and the rule.",
      PyExc_ValueError, nullptr);
  m.attr("Error") = nb::handle(g_error_type);
  m.attr("FormatError") = nb::handle(g_format_error_type);
  g_decompression_bomb_warning = PyErr_NewExceptionWithDoc(
      "leanloader.DecompressionBombWarning",
      "An image above max_pixels was decoded (Pillow's DecompressionBombWarning; while Pillow "
      "is imported the warning is an instance of Pillow's class too).",
      PyExc_RuntimeWarning, nullptr);
  m.attr("DecompressionBombWarning") = nb::handle(g_decompression_bomb_warning);
  m.def(
      "decompression_bomb_warning_with_pillows",
      [] {
        PyObject* type = with_pillows_warning(/*import_pillow=*/true);
        if (type == nullptr) throw nb::import_error("Pillow (PIL.Image) cannot be imported");
        return nb::borrow(type);
      },
      "leanloader.DecompressionBombWarning deriving from Pillow's class too (imports Pillow).");

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const Error& e) {
      set_python_error(e);
    }
  });
}

}  // namespace leanloader::bindings
