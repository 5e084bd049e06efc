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
  m.def(
      "copy_as_batch_slot",
      [](nb::ndarray<nb::c_contig, nb::device::cpu> dst,
         nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu> src) {
        if (dst.nbytes() != src.nbytes()) {
          throw nb::value_error(("copy_as_batch_slot: dst holds " + std::to_string(dst.nbytes()) +
                                 " bytes, src " + std::to_string(src.nbytes()))
                                    .c_str());
        }
        nb::gil_scoped_release released;
        copy_as_batch_slot(dst.data(), src.data(), src.nbytes());
      },
      nb::arg("dst"), nb::arg("src"),
      "Copies `src` into `dst` (C-contiguous, as many bytes; must not overlap)\n"
      "as the loader fills a batch slot of that size: streaming stores for\n"
      "large batches, memcpy for small ones. Releases the GIL.");
}

}  // namespace leanloader::bindings
