// Python: shared-memory segments, batch slot pools and packed records for
// ProcessWorkers (python/leanloader/dataloader.py, workers.py,
// shared_records.py). Glue only; the logic is in src/shared_segment.cc,
// src/slot_pool.cc, src/shared_records.cc.
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "bindings.h"
#include "leanloader/device/device_read_fence.h"
#include "leanloader/device/host_pinning.h"
#include "leanloader/workers/file_backing.h"
#include "leanloader/workers/shared_arena.h"
#include "leanloader/workers/shared_copy.h"
#include "leanloader/workers/shared_records.h"
#include "leanloader/workers/shared_segment.h"
#include "leanloader/workers/slot_pool.h"
#include "leanloader/workers/worker_process.h"

namespace nb = nanobind;

namespace leanloader::bindings {

namespace {

// Any C-contiguous CPU array (NumPy, torch through DLPack, a bytes-like
// object through the buffer protocol).
using ContiguousArray = nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu>;

DType parse_dtype(const std::string& name) {
  const auto dtype = dtype_from_name(name);
  if (!dtype) throw InvalidArgument("unknown dtype '" + name + "' (use a safetensors name: F32)");
  return *dtype;
}

nb::object view(const std::shared_ptr<Storage>& storage, size_t offset, const std::string& dtype,
                const std::vector<int64_t>& shape, const std::string& output) {
  const Tensor tensor(storage, offset, parse_dtype(dtype), shape);
  return tensor_to_python(tensor, parse_output_framework(output));
}

size_t array_bytes(const ContiguousArray& array) { return array.size() * array.itemsize(); }

// A slot handed to the user: its tensors keep the slot (not this object)
// alive; the slot is free once this object and every tensor are gone.
struct SlotHold {
  std::shared_ptr<Storage> storage;
};

}  // namespace

void bind_process(nb::module_& m) {
  m.def("default_shm_dir", &default_shm_dir,
        "Where shared memory segments are created: $LEANLOADER_SHM_DIR, or '' for anonymous "
        "shared memory (memfds).");
  m.def("set_parent_death_signal", &set_parent_death_signal, nb::arg("signal"),
        nb::arg("expected_parent"),
        "prctl(PR_SET_PDEATHSIG): this process gets `signal` when its parent dies. "
        "False when `expected_parent` is already gone.");
  m.def("exit_with_process", &exit_with_process, nb::arg("pid"),
        "SIGKILLs this process when process `pid` exits (a native thread on a pidfd). False "
        "when `pid` is already gone.");
  m.def("set_process_name", &set_process_name, nb::arg("name"),
        "prctl(PR_SET_NAME): the name `ps` and `top` show for this process (15 bytes kept).");

  nb::class_<SharedSegment>(
      m, "SharedSegment",
      "Shared memory reserved in full (posix_fallocate) that never has a name (a memfd, or an "
      "O_TMPFILE file in `dir`): a full directory is an OSError(ENOSPC) here, and nothing is "
      "left behind after any exit. Other processes attach through attach_path while this "
      "process lives.")
      .def_static(
          "create",
          [](size_t size, std::optional<std::string> dir) {
            nb::gil_scoped_release release;
            return SharedSegment::create(size, dir.value_or(""));
          },
          nb::arg("size"), nb::arg("dir") = nb::none())
      .def_static(
          "attach",
          [](const std::string& path, bool writable, bool copy_on_write, size_t file_offset,
             size_t size) {
            nb::gil_scoped_release release;
            return SharedSegment::attach(path, writable, copy_on_write, file_offset, size);
          },
          nb::arg("path"), nb::arg("writable") = true, nb::arg("copy_on_write") = false,
          nb::arg("file_offset") = 0, nb::arg("size") = 0,
          "Maps `size` bytes of the file at `path` from `file_offset` (size 0: the whole "
          "file); segments of one file share one descriptor.")
      .def_prop_ro("size", &SharedSegment::size)
      .def_prop_ro("fd", &SharedSegment::fd)
      .def_prop_ro("file_offset", &SharedSegment::file_offset)
      .def_prop_ro("path", &SharedSegment::path)
      .def_prop_ro("writable", &SharedSegment::writable)
      .def_prop_ro("copy_on_write", &SharedSegment::copy_on_write)
      .def_prop_ro("attach_path", &SharedSegment::attach_path)
      .def_prop_ro(
          "address",
          [](const SharedSegment& self) { return reinterpret_cast<uintptr_t>(self.data()); })
      .def(
          "write",
          [](SharedSegment& self, size_t offset, const ContiguousArray& array) {
            const size_t bytes = array_bytes(array);
            nb::gil_scoped_release release;
            self.write(offset, array.data(), bytes);
            return reinterpret_cast<uintptr_t>(array.data());
          },
          nb::arg("offset"), nb::arg("array"),
          "Copies a C-contiguous CPU array's bytes to `offset`; returns the address they were "
          "copied from (where the array's memory is, for a caller that watches it).")
      .def(
          "array",
          [](const std::shared_ptr<SharedSegment>& self, size_t offset, const std::string& dtype,
             const std::vector<int64_t>& shape,
             const std::string& output) { return view(self, offset, dtype, shape, output); },
          nb::arg("offset"), nb::arg("dtype"), nb::arg("shape"), nb::arg("output") = "numpy",
          "A zero-copy array over the segment that keeps it alive.");

  nb::class_<SharedArena>(
      m, "SharedArena",
      "Many shared memory segments in one unnamed file (one descriptor for all): each "
      "allocate() is a page-aligned range, whose pages go back to the system when its last "
      "segment goes (unless a mapping may still read them: shared_arena.h).")
      .def(nb::new_([](std::optional<std::string> dir) {
             return SharedArena::create(dir.value_or(""));
           }),
           nb::arg("dir") = nb::none())
      .def(
          "allocate",
          [](const std::shared_ptr<SharedArena>& self, size_t size) {
            nb::gil_scoped_release release;
            return self->allocate(size);
          },
          nb::arg("size"), "A new segment of `size` bytes, its pages reserved.")
      .def_prop_ro("fd", &SharedArena::fd)
      .def_prop_ro("path", &SharedArena::path)
      .def_prop_ro("file_bytes", &SharedArena::file_bytes)
      .def_prop_ro("held_back_ranges", &SharedArena::held_back_ranges);

  m.def(
      "shared_copy",
      [](uintptr_t address, size_t bytes, SharedArena& arena, bool share_pages) {
        // The GIL stays held (no Python thread can free the block meanwhile);
        // a thread writing the block without it (a NumPy or torch loop) waits
        // while a chunk's pages change hands (src/workers/held_writes.h).
        const SharedCopy copy =
            make_shared_copy(reinterpret_cast<void*>(address), bytes, arena,
                             share_pages ? PageSharing::kWhereSafe : PageSharing::kOff);
        return nb::make_tuple(copy.segment, copy.offset, copy.shared_bytes);
      },
      nb::arg("address"), nb::arg("bytes"), nb::arg("arena"), nb::arg("share_pages") = true,
      "A copy of `bytes` bytes at `address` in a new segment of `arena`: (segment, offset, "
      "shared_bytes). "
      "With share_pages, where the block is a whole glibc mmapped chunk (the pointer malloc "
      "returned), its pages are then mapped from the copy, copy-on-write: one copy in all.");
  m.def(
      "copy_is_current",
      [](uintptr_t source, uintptr_t copy, size_t bytes, bool pages_shared) {
        nb::gil_scoped_release release;
        return copy_is_current(reinterpret_cast<const void*>(source),
                               reinterpret_cast<const void*>(copy), bytes, pages_shared);
      },
      nb::arg("source"), nb::arg("copy"), nb::arg("bytes"), nb::arg("pages_shared") = true,
      "Whether `bytes` bytes at `source` equal those at `copy` (a shared copy made earlier; "
      "pages_shared: whether shared_copy mapped the source's pages from it).");
  m.def(
      "file_backing",
      [](uintptr_t address, size_t bytes) -> nb::object {
        std::optional<FileBacking> backing;
        {
          nb::gil_scoped_release release;
          backing = file_backing(reinterpret_cast<const void*>(address), bytes);
        }
        if (!backing) return nb::none();
        return nb::make_tuple(backing->path, backing->offset, backing->device, backing->inode,
                              backing->shared);
      },
      nb::arg("address"), nb::arg("bytes"),
      "(path, file offset, st_dev, st_ino, shared) when `bytes` bytes at `address` are a "
      "file's bytes still (mapped shared, read-only, or private and unwritten); else None.");
  m.def(
      "page_sharing_refusal",
      [](uintptr_t address, size_t bytes) {
        return page_sharing_refusal(reinterpret_cast<const void*>(address), bytes);
      },
      nb::arg("address"), nb::arg("bytes"),
      "Why shared_copy cannot share the pages of this block, or '' when it can.");
  m.def(
      "page_sharing_refusals",
      [](const std::vector<std::pair<uintptr_t, size_t>>& blocks) {
        // The GIL stays held, as above: a block's malloc header is read.
        std::vector<std::pair<const void*, size_t>> ranges;
        ranges.reserve(blocks.size());
        for (const auto& [address, bytes] : blocks) {
          ranges.emplace_back(reinterpret_cast<const void*>(address), bytes);
        }
        return page_sharing_refusals(ranges);
      },
      nb::arg("blocks"),
      "page_sharing_refusal for each (address, bytes) of `blocks`, reading the process's "
      "mappings once.");

  m.def(
      "shared_mapping_descriptor",
      [](uintptr_t address, size_t bytes) {
        return shared_mapping_descriptor(reinterpret_cast<const void*>(address), bytes);
      },
      nb::arg("address"), nb::arg("bytes"),
      "A descriptor of the file mapped shared from its start at `address` (holding at least "
      "`bytes` bytes), or -1.");
  m.def(
      "find_shared_segment",
      [](uintptr_t address) { return SharedSegment::find(reinterpret_cast<const void*>(address)); },
      nb::arg("address"), "The live segment of this process containing `address`, or None.");
  m.def("forget_fork_of_a_child_that_reads_no_released_range",
        &forget_fork_of_a_child_that_reads_no_released_range,
        "Called right after fork() in the parent: the child (the fork server) reads no arena "
        "range this process releases from now on, so released ranges can still be punched.");

  nb::class_<SlotHold>(m, "SlotHold", "A batch slot held by the batches that view it.")
      .def(
          "tensor",
          [](const SlotHold& self, size_t offset, const std::string& dtype,
             const std::vector<int64_t>& shape, const std::string& output) {
            return view(self.storage, offset, dtype, shape, output);
          },
          nb::arg("offset"), nb::arg("dtype"), nb::arg("shape"), nb::arg("output"),
          "A zero-copy tensor at `offset` in the slot; it keeps the slot held.");

  nb::class_<SlotPool>(m, "SlotPool",
                       "Batch slots in one shared segment: acquire -> worker writes -> hold.")
      .def_static(
          "create",
          [](size_t slot_bytes, size_t num_slots, std::optional<std::string> dir) {
            nb::gil_scoped_release release;
            return SlotPool::create(slot_bytes, num_slots, dir.value_or(""));
          },
          nb::arg("slot_bytes"), nb::arg("num_slots"), nb::arg("dir") = nb::none())
      .def_static(
          "adopt",
          [](std::shared_ptr<SharedSegment> segment, size_t slot_bytes, size_t num_slots,
             std::shared_ptr<HostPinning> pinning) {
            nb::gil_scoped_release release;  // page-locking a large segment takes a while
            return SlotPool::adopt(std::move(segment), slot_bytes, num_slots, std::move(pinning));
          },
          nb::arg("segment"), nb::arg("slot_bytes"), nb::arg("num_slots") = 1,
          nb::arg("pinning") = nb::none(),
          "A pool over an existing segment (a batch segment a worker created); with `pinning`, "
          "the segment is page-locked until the pool is gone.")
      .def("acquire", &SlotPool::acquire, "A free slot id, or None when all are in use.")
      .def("release", &SlotPool::release, nb::arg("slot"))
      .def(
          "hold",
          [](SlotPool& self, size_t slot, std::shared_ptr<DeviceReadFence> fence) {
            return SlotHold{self.hold(slot, std::move(fence))};
          },
          nb::arg("slot"), nb::arg("fence") = nb::none(),
          "The slot as a Storage; with `fence`, it is reused only after the device reads queued "
          "before its release are over.")
      .def("slot_offset", &SlotPool::slot_offset, nb::arg("slot"))
      .def_prop_ro("slot_bytes", &SlotPool::slot_bytes)
      .def_prop_ro("num_slots", &SlotPool::num_slots)
      .def_prop_ro("slots_in_use", &SlotPool::slots_in_use)
      .def_prop_ro("segment", &SlotPool::segment);

  nb::class_<SharedRecords>(m, "SharedRecordsBuffer",
                            "Byte records packed into one shared segment with an offset index.")
      .def_static(
          "pack",
          [](const std::vector<nb::bytes>& records, std::optional<std::string> dir) {
            std::vector<std::string_view> views;
            views.reserve(records.size());
            for (const nb::bytes& r : records) views.emplace_back(r.c_str(), r.size());
            nb::gil_scoped_release release;
            return SharedRecords::pack(views, dir.value_or(""));
          },
          nb::arg("records"), nb::arg("dir") = nb::none())
      .def_static("attach", &SharedRecords::attach, nb::arg("segment"))
      .def("__len__", &SharedRecords::size)
      .def(
          "get",
          [](const SharedRecords& self, int64_t index) {
            const auto n = static_cast<int64_t>(self.size());
            if (index < 0) index += n;
            if (index < 0 || index >= n) {
              throw nb::index_error(
                  ("record index out of range for " + std::to_string(n) + " records").c_str());
            }
            const auto bytes = self.record(static_cast<size_t>(index));
            return nb::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size());
          },
          nb::arg("index"), "A copy of record `index`'s bytes (negative indices count back).")
      .def_prop_ro("data_bytes", &SharedRecords::data_bytes)
      .def_prop_ro("segment", &SharedRecords::segment);
}

}  // namespace leanloader::bindings
