// Device runtimes, slot pinning and the device feed: glue only (the ordering
// logic is src/device/device_feed.cc).
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>

#include "bindings.h"
#include "leanloader/device/cuda_runtime.h"
#include "leanloader/device/device_feed.h"
#include "leanloader/device/host_pinning.h"
#include "leanloader/device/host_stand_in_runtime.h"

namespace nb = nanobind;

namespace leanloader::bindings {

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
           "Waits until the work enqueued on `stream` so far has run (the host as consumer).");

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
