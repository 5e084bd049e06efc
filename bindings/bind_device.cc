// Device runtimes, slot pinning and the device feed: glue only (the ordering
// logic is src/device/device_feed.cc).
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>

#include <chrono>
#include <cstdint>
#include <optional>

#include "bindings.h"
#include "leanloader/device/cuda_runtime.h"
#include "leanloader/device/device_feed.h"
#include "leanloader/device/device_read_fence.h"
#include "leanloader/device/host_pinning.h"
#include "leanloader/device/host_stand_in_runtime.h"

namespace nb = nanobind;

namespace leanloader::bindings {

namespace {

// The stream current where a batch is released, asked of a Python callable
// (torch's current stream): only on a thread that holds the GIL (a tensor
// dropped by Python code) and never while the interpreter shuts down; an
// exception in flight is kept as it was. The callable is held by a weak
// reference (its owner, the loader's pinning, holds it): a strong one, out
// of the garbage collector's sight, could close a cycle through the
// callable's globals that would keep the loader alive.
class PythonCurrentStream {
 public:
  explicit PythonCurrentStream(const nb::object& callable)
      : weak_(PyWeakref_NewRef(callable.ptr(), nullptr)) {
    if (weak_ == nullptr) nb::raise_python_error();
  }
  ~PythonCurrentStream() {
    // Without the GIL the weak reference is left (one small object).
    if (Py_IsInitialized() && PyGILState_Check()) Py_DECREF(weak_);
  }
  PythonCurrentStream(const PythonCurrentStream&) = delete;
  PythonCurrentStream& operator=(const PythonCurrentStream&) = delete;

  std::optional<DeviceRuntime::Stream> operator()() const noexcept {
    if (!Py_IsInitialized() || finalizing() || !PyGILState_Check()) return std::nullopt;
    PyObject *type = nullptr, *value = nullptr, *traceback = nullptr;
    PyErr_Fetch(&type, &value, &traceback);
    std::optional<DeviceRuntime::Stream> stream;
    PyObject* callable = strong_reference();
    if (callable != nullptr) {
      if (PyObject* result = PyObject_CallNoArgs(callable)) {
        const unsigned long long handle = PyLong_AsUnsignedLongLong(result);
        Py_DECREF(result);
        if (!PyErr_Occurred()) stream = static_cast<DeviceRuntime::Stream>(handle);
      }
      Py_DECREF(callable);
    }
    PyErr_Clear();
    PyErr_Restore(type, value, traceback);
    return stream;
  }

 private:
  // The callable (a new reference), or nullptr once it is gone.
  PyObject* strong_reference() const noexcept {
#if PY_VERSION_HEX >= 0x030D0000
    PyObject* callable = nullptr;
    return PyWeakref_GetRef(weak_, &callable) == 1 ? callable : nullptr;
#else
    PyObject* callable = PyWeakref_GetObject(weak_);  // borrowed; None once gone
    if (callable == nullptr || callable == Py_None) return nullptr;
    Py_INCREF(callable);
    return callable;
#endif
  }
  static bool finalizing() noexcept {
#if PY_VERSION_HEX >= 0x030D0000
    return Py_IsFinalizing();
#else
    return _Py_IsFinalizing();
#endif
  }
  PyObject* weak_;
};

}  // namespace

void bind_device(nb::module_& m) {
  nb::class_<DeviceRuntime>(m, "DeviceRuntime",
                            "An accelerator runtime (CUDA) or its CPU stand-in.")
      .def_prop_ro("name", &DeviceRuntime::name)
      .def_prop_ro("is_cuda", [](const DeviceRuntime& self) { return !self.location().is_cpu(); });
  nb::class_<CudaRuntime, DeviceRuntime>(m, "CudaRuntime");
  nb::class_<HostStandInRuntime, DeviceRuntime>(m, "HostStandInRuntime")
      .def_prop_ro("registered_bytes", &HostStandInRuntime::registered_bytes)
      .def_prop_ro("registrations", &HostStandInRuntime::registrations)
      .def_prop_ro("allocated_bytes", &HostStandInRuntime::allocated_bytes)
      .def("drain", &HostStandInRuntime::drain, nb::arg("stream"),
           nb::call_guard<nb::gil_scoped_release>(),
           "Waits until the work enqueued on `stream` so far has run (the host as consumer).")
      // Test hooks: streams, a delay on one, and copies whose result can be read back.
      .def("create_stream", &HostStandInRuntime::create_stream)
      .def("destroy_stream", &HostStandInRuntime::destroy_stream, nb::arg("stream"),
           nb::call_guard<nb::gil_scoped_release>())
      .def(
          "delay",
          [](HostStandInRuntime& self, DeviceRuntime::Stream stream, int64_t milliseconds) {
            self.delay(stream, std::chrono::milliseconds(milliseconds));
          },
          nb::arg("stream"), nb::arg("milliseconds"),
          "Holds `stream` for that long before its later work runs.")
      .def(
          "allocate",
          [](HostStandInRuntime& self, size_t bytes) {
            return reinterpret_cast<uintptr_t>(self.allocate(bytes));
          },
          nb::arg("bytes"))
      .def(
          "free",
          [](HostStandInRuntime& self, uintptr_t data) {
            self.free(reinterpret_cast<std::byte*>(data));
          },
          nb::arg("data"))
      .def(
          "copy_to_device",
          [](HostStandInRuntime& self, uintptr_t device, uintptr_t host, size_t bytes,
             DeviceRuntime::Stream stream) {
            self.copy_to_device(reinterpret_cast<std::byte*>(device),
                                reinterpret_cast<const std::byte*>(host), bytes, stream);
          },
          nb::arg("device"), nb::arg("host"), nb::arg("bytes"), nb::arg("stream"),
          "Queues a copy from host memory (a tensor's data_ptr()) on `stream`.")
      .def(
          "read",
          [](HostStandInRuntime&, uintptr_t device, size_t bytes) {
            // Stand-in device memory is host memory.
            return nb::bytes(reinterpret_cast<const char*>(device), bytes);
          },
          nb::arg("device"), nb::arg("bytes"), "The bytes of stand-in device memory.");

  m.def(
      "cuda_runtime",
      [](int index) -> std::shared_ptr<DeviceRuntime> { return CudaRuntime::load(index); },
      nb::arg("index"), "The CUDA runtime of GPU `index` (libcudart loaded at run time).");
  m.def("cuda_device_count", &CudaRuntime::device_count,
        "GPUs the CUDA runtime sees; 0 when libcudart cannot be loaded.");
  m.def(
      "host_stand_in_runtime",
      []() -> std::shared_ptr<HostStandInRuntime> {
        return std::make_shared<HostStandInRuntime>();
      },
      "A CPU stand-in with CUDA's stream/event ordering, for tests.");

  nb::class_<HostPinning>(m, "HostPinning", "Page-locks batch slots in place as they are made.")
      .def(nb::init<std::shared_ptr<DeviceRuntime>>(), nb::arg("runtime"))
      .def_prop_ro("pinned_bytes", &HostPinning::pinned_bytes)
      .def_prop_ro("peak_pinned_bytes", &HostPinning::peak_pinned_bytes);

  nb::class_<DeviceReadFence>(m, "DeviceReadFence",
                              "Holds released pinned slots back until the device reads queued "
                              "before their release are over.")
      .def(
          "__init__",
          [](DeviceReadFence* self, std::shared_ptr<DeviceRuntime> runtime,
             nb::object current_stream) {
            DeviceReadFence::CurrentStream current;
            if (!current_stream.is_none()) {
              auto ask = std::make_shared<PythonCurrentStream>(current_stream);
              current = [ask] { return (*ask)(); };
            }
            new (self) DeviceReadFence(std::move(runtime), std::move(current));
          },
          nb::arg("runtime"), nb::arg("current_stream") = nb::none(),
          "`current_stream()`: the stream current on the calling thread; held by a weak "
          "reference (keep it alive).")
      .def("note_consumer_stream", &DeviceReadFence::note_consumer_stream, nb::arg("stream"))
      .def("collect", &DeviceReadFence::collect,
           "Gives back the slots whose device reads are over; returns how many.")
      .def_prop_ro("ready_fd", &DeviceReadFence::ready_fd,
                   "Readable while collect() has slots to give back.")
      .def_prop_ro("completed", &DeviceReadFence::completed)
      .def_prop_ro("pending", &DeviceReadFence::pending)
      .def_prop_ro("fenced_total", &DeviceReadFence::fenced_total);

  nb::class_<DeviceFeed>(m, "DeviceFeed", "Copies a Loader's batches to a device, overlapped.")
      .def(nb::init<std::shared_ptr<DeviceRuntime>, size_t, int>(), nb::arg("runtime"),
           nb::arg("block_bytes"), nb::arg("prefetch_to_device"))
      .def("reset", &DeviceFeed::reset, nb::call_guard<nb::gil_scoped_release>())
      .def_prop_ro("device_bill", &DeviceFeed::device_bill)
      .def_prop_ro("device_resident_bytes", &DeviceFeed::device_resident_bytes)
      .def_prop_ro("overflow_total", &DeviceFeed::overflow_total)
      .def_prop_ro("copies_completed", &DeviceFeed::copies_completed)
      .def_prop_ro("prefetch_to_device", &DeviceFeed::prefetch_to_device);
}

}  // namespace leanloader::bindings
