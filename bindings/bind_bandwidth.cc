// Python: leanloader._core.measure_memcpy_bandwidth, the benchmark yardstick.
#include "bindings.h"
#include "leanloader/memory/bandwidth.h"

namespace nb = nanobind;

namespace leanloader::bindings {

void bind_bandwidth(nb::module_& m) {
  m.def("measure_memcpy_bandwidth", &measure_memcpy_bandwidth, nb::arg("threads"),
        nb::arg("bytes_per_thread") = size_t{64} << 20, nb::arg("repeats") = 5,
        nb::call_guard<nb::gil_scoped_release>(),
        "Bytes per second copied by `threads` threads each copying its own\n"
        "`bytes_per_thread` buffer at once (median of `repeats` passes after a\n"
        "warm-up; buffers prefaulted), with memcpy or with streaming stores,\n"
        "whichever is faster. The ceiling for batch assembly.");
}

}  // namespace leanloader::bindings
