// Loader and its epoch iterator. The consumer waits with the GIL released,
// in short slices so that Ctrl-C (KeyboardInterrupt) is seen promptly.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "bindings.h"
#include "leanloader/core/byte_size.h"
#include "leanloader/device/device_feed.h"
#include "leanloader/device/host_pinning.h"
#include "leanloader/pipeline/loader.h"

namespace nb = nanobind;

namespace leanloader::bindings {

namespace {

// How often a waiting consumer checks for signals.
constexpr std::chrono::milliseconds kSignalCheckInterval(50);

OnError parse_on_error(const std::string& text) {
  if (text == "raise") return OnError::kRaise;
  if (text == "skip") return OnError::kSkip;
  throw InvalidArgument("on_error must be 'raise' or 'skip', got '" + text + "'");
}

Collate parse_collate(const std::string& text) {
  if (text == "stack") return Collate::kStack;
  if (text == "list") return Collate::kList;
  throw InvalidArgument("collate must be 'stack' or 'list', got '" + text + "'");
}

nb::dict batch_to_dict(const Source& source, Batch& batch, OutputFramework framework) {
  nb::dict out;
  const auto& fields = source.fields();
  for (size_t f = 0; f < fields.size(); ++f) {
    try {
      if (!batch.stacked.empty()) {
        out[fields[f].name.c_str()] = tensor_to_python(batch.stacked[f], framework);
      } else {
        nb::list items;
        for (const Tensor& tensor : batch.listed[f])
          items.append(tensor_to_python(tensor, framework));
        out[fields[f].name.c_str()] = items;
      }
    } catch (const InvalidArgument& error) {
      throw InvalidArgument(source.describe() + " field '" + fields[f].name + "': " + error.what());
    }
  }
  return out;
}

// Set once, by the exit handler (loader.py), before it cancels the passes.
std::atomic<bool> interpreter_exiting{false};

[[noreturn]] void park_until_exit() {
  // What this thread holds is left to the OS; nanobind's leak report at
  // exit would list it as leaked instances (a flag store, read by the main
  // thread at the module's teardown, later).
  nb::set_leak_warnings(false);
  for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
}

}  // namespace

void bind_loader(nb::module_& m) {
  m.def(
      "mark_interpreter_exiting", [] { interpreter_exiting.store(true); },
      "Called by the exit handler before it closes the open loaders: a thread still waiting in "
      "next_batch then never takes the GIL back.");
  nb::class_<EpochIterator>(m, "EpochIterator", "One pass over an epoch; dropping it cancels it.")
      .def(
          "next_batch",
          [](EpochIterator& self, const Source& source, const std::string& output, DeviceFeed* feed,
             uintptr_t stream) -> nb::object {
            const OutputFramework framework = parse_output_framework(output);
            Batch batch;
            const auto warn = [](const std::vector<Warning>& warnings) {
              for (const Warning& warning : warnings) {
                if (PyErr_WarnEx(warning_category(warning.kind), warning.message.c_str(), 2) != 0) {
                  throw nb::python_error();
                }
              }
            };
            while (true) {
              EpochIterator::Status status;
              {
                nb::gil_scoped_release release;
                // The program is exiting (a daemon thread's pass, cancelled by
                // the exit handler): taking the GIL back now would have
                // CPython end this thread with pthread_exit through the frames
                // above, which aborts the process. It waits for the exit.
                try {
                  status = feed != nullptr ? feed->next(self, batch, stream, kSignalCheckInterval)
                                           : self.next(batch, kSignalCheckInterval);
                } catch (...) {
                  if (interpreter_exiting.load()) park_until_exit();
                  throw;
                }
                if (interpreter_exiting.load()) park_until_exit();
              }
              if (status == EpochIterator::Status::kBatch) break;
              if (status == EpochIterator::Status::kEnd) {
                warn(self.take_warnings());
                return nb::none();
              }
              if (PyErr_CheckSignals() != 0) throw nb::python_error();
            }
            try {
              warn(batch.warnings);
            } catch (...) {
              self.undo_last_delivery();  // (a warning raised as an error: the batch is lost)
              throw;
            }
            nb::dict out = batch_to_dict(source, batch, framework);
            return nb::make_tuple(out, nb::cast(batch.indices));
          },
          nb::arg("source"), nb::arg("output"), nb::arg("feed").none() = nb::none(),
          nb::arg("stream") = 0,
          "The next (batch dict, sample indices) in order, or None at the end; with `feed`, "
          "on its device, ordered before later work on `stream`.")
      .def_prop_ro("epoch", &EpochIterator::epoch)
      .def("skipped",
           [](const EpochIterator& self) {
             nb::list out;
             for (const SkippedSample& s : self.skipped()) {
               out.append(nb::make_tuple(s.sample_index, s.message));
             }
             return out;
           })
      .def_prop_ro("skipped_count", &EpochIterator::skipped_count)
      .def("cancel", &EpochIterator::cancel);

  nb::class_<LoaderState>(m, "LoaderState", "Where a Loader stands: epoch and global position.")
      .def(nb::init<>())
      .def_ro_static("VERSION", &LoaderState::kVersion)
      .def_rw("version", &LoaderState::version)
      .def_rw("epoch", &LoaderState::epoch)
      .def_rw("position", &LoaderState::position)
      .def_rw("seed", &LoaderState::seed)
      .def_rw("shuffle", &LoaderState::shuffle)
      .def_rw("batch_size", &LoaderState::batch_size)
      .def_rw("drop_last", &LoaderState::drop_last)
      .def_rw("world_size", &LoaderState::world_size)
      .def_rw("size", &LoaderState::size)
      .def_rw("fingerprint", &LoaderState::fingerprint);
  m.def("source_fingerprint", &source_fingerprint, nb::arg("source"),
        "Cheap identity of a source: size, field specs and describe(), hashed.");

  nb::class_<Loader>(m, "Loader")
      .def(
          "__init__",
          [](Loader* self, std::shared_ptr<Source> source, int64_t batch_size, bool shuffle,
             uint64_t seed, int num_threads, int prefetch, std::optional<size_t> memory_budget,
             bool drop_last, const std::string& on_error, double max_skip_fraction,
             const std::string& collate, std::optional<size_t> pressure_threshold, uint64_t rank,
             uint64_t world_size, bool follow_updates, std::shared_ptr<HostPinning> pinning) {
            LoaderOptions options;
            options.batch_size = batch_size;
            options.shuffle = shuffle;
            options.seed = seed;
            options.num_threads = num_threads;
            options.prefetch = prefetch;
            options.memory_budget = memory_budget;
            options.drop_last = drop_last;
            options.on_error = parse_on_error(on_error);
            options.max_skip_fraction = max_skip_fraction;
            options.collate = parse_collate(collate);
            options.pressure_threshold = pressure_threshold;
            options.rank = rank;
            options.world_size = world_size;
            options.follow_updates = follow_updates;
            options.slot_hooks = std::move(pinning);
            new (self) Loader(std::move(source), options);
          },
          nb::arg("source"), nb::arg("batch_size"), nb::arg("shuffle"), nb::arg("seed"),
          nb::arg("num_threads"), nb::arg("prefetch"), nb::arg("memory_budget").none(),
          nb::arg("drop_last"), nb::arg("on_error"), nb::arg("max_skip_fraction"),
          nb::arg("collate"), nb::arg("pressure_threshold").none() = nb::none(),
          nb::arg("rank") = 0, nb::arg("world_size") = 1, nb::arg("follow_updates") = true,
          nb::arg("pinning").none() = nb::none())
      .def("__len__", &Loader::num_batches)
      .def("set_epoch", &Loader::set_epoch, nb::arg("epoch"))
      .def_prop_ro("epoch", &Loader::epoch)
      .def("memory_bill", &Loader::memory_bill)
      .def_prop_ro("slot_bytes", &Loader::slot_bytes)
      .def_prop_ro("num_slots", &Loader::num_slots)
      .def_prop_ro("prefetch", &Loader::effective_prefetch)
      .def_prop_ro("rank", [](const Loader& self) { return self.options().rank; })
      .def_prop_ro("world_size", [](const Loader& self) { return self.options().world_size; })
      .def("state", &Loader::state)
      .def("load_state", &Loader::load_state, nb::arg("state"),
           nb::call_guard<nb::gil_scoped_release>())
      .def("iterate", &Loader::iterate, nb::call_guard<nb::gil_scoped_release>())
      .def("close", &Loader::close, nb::call_guard<nb::gil_scoped_release>())
      .def("stats", [](const Loader& self) {
        const LoaderStats s = self.stats();
        nb::dict out;
        out["read_s"] = static_cast<double>(s.read_ns) * 1e-9;
        out["collate_s"] = static_cast<double>(s.collate_ns) * 1e-9;
        out["consumer_wait_s"] = static_cast<double>(s.consumer_wait_ns) * 1e-9;
        out["window_wait_s"] = static_cast<double>(s.window_wait_ns) * 1e-9;
        out["samples_read"] = s.samples_read;
        out["work_claims"] = s.work_claims;
        out["samples_skipped"] = s.samples_skipped;
        out["samples_warned"] = s.samples_warned;
        out["batches_delivered"] = s.batches_delivered;
        out["slots_total"] = s.slots_total;
        out["slots_in_use"] = s.slots_in_use;
        out["overflow_slots_in_use"] = s.overflow_slots_in_use;
        out["overflow_slots_total"] = s.overflow_slots_total;
        out["heap_fallback_bytes"] = s.heap_fallback_bytes;
        out["batches_in_flight"] = s.batches_in_flight;
        out["bytes_in_flight"] = s.bytes_in_flight;
        out["slot_bytes"] = s.slot_bytes;
        out["planned_bytes"] = s.planned_bytes;
        out["resident_bytes"] = s.resident_bytes;
        out["num_threads"] = s.num_threads;
        out["prefetch"] = s.prefetch;
        out["window"] = s.window;
        out["under_pressure"] = s.under_pressure;
        out["pressure_events"] = s.pressure_events;
        out["pressure_threshold"] = s.pressure_threshold;
        return out;
      });

  m.def("auto_memory_budget", &auto_memory_budget,
        "Bytes memory_budget='auto' stands for: a quarter of the available memory (cgroup-aware).");
  m.def("parse_byte_size", &parse_byte_size, nb::arg("text"),
        "Bytes in '4GiB', '512MB', '1.5 GB' or '1024'.");
}

}  // namespace leanloader::bindings
