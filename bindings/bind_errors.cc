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

void bind_errors(nb::module_& m) {
  g_error_type = PyErr_NewExceptionWithDoc(
      "leanloader.Error", "Base class of leanloader's own errors.", PyExc_RuntimeError, nullptr);
  g_format_error_type = PyErr_NewExceptionWithDoc(
      "leanloader.FormatError",
      "Malformed bytes in a file leanloader reads; the message names the file and the rule.",
      PyExc_ValueError, nullptr);
  m.attr("Error") = nb::handle(g_error_type);
  m.attr("FormatError") = nb::handle(g_format_error_type);

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const Error& e) {
      set_python_error(e);
    }
  });
}

}  // namespace leanloader::bindings
