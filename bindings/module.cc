// The extension module leanloader._core: only the NB_MODULE entry point.
#include <nanobind/nanobind.h>

#include "bindings.h"

NB_MODULE(_core, m) {
  using namespace leanloader::bindings;
  m.doc() = "leanloader's native core (C++20). Use the `leanloader` package, not this module.";
  bind_errors(m);
  bind_tensor(m);
  bind_sources(m);
  bind_loader(m);
  bind_memory(m);
  bind_planner(m);
  bind_safetensors(m);
  bind_bandwidth(m);
  bind_python_tasks(m);
  bind_process(m);
  bind_cache(m);
  bind_hdf5(m);
  bind_image(m);
  bind_device(m);
}
