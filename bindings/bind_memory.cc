// Python: the MemoryMonitor (leanloader.memory wraps these) and the
// process-tree sampler the benchmark harness calls every 50 ms.
#include <nanobind/stl/string.h>

#include "bindings.h"
#include "leanloader/memory/memory_monitor.h"

namespace nb = nanobind;

namespace leanloader::bindings {

namespace {

template <typename Memory>
void put_bytes(nb::dict& d, const Memory& memory) {
  d["rss_bytes"] = memory.rss_bytes;
  d["pss_bytes"] = memory.pss_bytes;
  d["pss_anon_bytes"] = memory.pss_anon_bytes;
  d["pss_file_bytes"] = memory.pss_file_bytes;
  d["pss_shmem_bytes"] = memory.pss_shmem_bytes;
  d["uss_bytes"] = memory.uss_bytes;
  d["swap_bytes"] = memory.swap_bytes;
}

nb::object optional_bytes(const std::optional<uint64_t>& value) {
  return value ? nb::object(nb::int_(*value)) : nb::object(nb::none());
}

nb::dict totals_to_dict(const MemoryTotals& totals) {
  nb::dict d;
  put_bytes(d, totals);
  d["fd_shmem_bytes"] = totals.fd_shmem_bytes;
  d["unreclaimable_bytes"] = totals.unreclaimable_bytes();
  d["num_processes"] = totals.num_processes;
  return d;
}

nb::dict shared_files_to_dict(const FdSharedMemory& held) {
  nb::dict d;
  d["num_files"] = held.num_files;
  d["held_bytes"] = held.held_bytes;
  d["mapped_bytes"] = held.mapped_bytes;
  d["unmapped_bytes"] = held.unmapped_bytes;
  nb::list owners;
  for (const SharedFileOwner& owner : held.owners) {
    nb::dict o;
    o["pid"] = owner.pid;
    o["name"] = owner.name;
    o["num_files"] = owner.num_files;
    o["held_bytes"] = owner.held_bytes;
    o["unmapped_bytes"] = owner.unmapped_bytes;
    owners.append(o);
  }
  d["owners"] = owners;
  return d;
}

nb::object gpus_to_object(const std::optional<std::vector<GpuMemory>>& gpus) {
  if (!gpus) return nb::none();
  nb::list out;
  for (const GpuMemory& g : *gpus) {
    nb::dict d;
    d["index"] = g.index;
    d["name"] = g.name;
    d["memory_info_supported"] = g.memory_info_supported;
    d["total_bytes"] = g.total_bytes;
    d["used_bytes"] = g.used_bytes;
    d["free_bytes"] = g.free_bytes;
    nb::list processes;
    for (const auto& [pid, bytes] : g.process_bytes) {
      nb::dict p;
      p["pid"] = pid;
      p["used_bytes"] = optional_bytes(bytes);
      processes.append(p);
    }
    d["processes"] = processes;
    out.append(d);
  }
  return out;
}

}  // namespace

void bind_memory(nb::module_& m) {
  m.def(
      "process_tree_memory",
      [](int pid) {
        MemoryTotals totals;
        {
          nb::gil_scoped_release release;
          totals = MemoryMonitor().tree_totals(pid);
        }
        return totals_to_dict(totals);
      },
      nb::arg("pid"),
      "Bytes summed over pid and its descendants (PSS-based: shared pages once):\n"
      "rss, pss, pss_anon, pss_file, pss_shmem, uss, swap, fd_shmem (shared memory\n"
      "held by the tree's descriptors and not mapped: unlinked /dev/shm files,\n"
      "memfds), unreclaimable (= pss_anon + pss_shmem + fd_shmem) and num_processes.\n"
      "Processes that exit while being read are skipped; num_processes is 0 when\n"
      "pid is gone. Reads /proc/*/stat, smaps_rollup and the fd directories (maps,\n"
      "and pagemap over the mappings of held files), with the GIL released.");

  m.def(
      "memory_snapshot",
      [](int pid, bool tree, const std::string& root, bool gpu) {
        const MemoryMonitor monitor(MemoryPaths{root});
        std::vector<ProcessMemory> processes;
        MemoryTotals totals;
        SystemMemory system;
        std::optional<CgroupMemory> cgroup;
        std::optional<std::vector<GpuMemory>> gpus;
        FdSharedMemory held;
        {
          nb::gil_scoped_release release;
          processes = monitor.read_processes(pid, tree);
          std::vector<int> pids;
          for (const ProcessMemory& process : processes) {
            totals.add(process);
            pids.push_back(process.pid);
          }
          held = monitor.fd_shared_memory(pids);
          totals.fd_shmem_bytes = held.unmapped_bytes;
          system = monitor.read_system();
          cgroup = monitor.read_cgroup(pid);
          if (gpu) gpus = monitor.read_gpus();
        }
        nb::dict out;
        nb::list process_list;
        uint64_t tree_gpu_bytes = 0;
        bool tree_gpu_known = gpus.has_value();
        for (const ProcessMemory& process : processes) {
          nb::dict d;
          d["pid"] = process.pid;
          d["name"] = process.name;
          put_bytes(d, process);
          d["from_smaps_rollup"] = process.from_smaps_rollup;
          std::optional<uint64_t> on_gpu;
          if (gpus) on_gpu = process_gpu_bytes(*gpus, process.pid);
          d["gpu_bytes"] = optional_bytes(on_gpu);
          if (!on_gpu) tree_gpu_known = false;
          tree_gpu_bytes += on_gpu.value_or(0);
          process_list.append(d);
        }
        out["processes"] = process_list;
        nb::dict total;
        put_bytes(total, totals);
        total["fd_shmem_bytes"] = totals.fd_shmem_bytes;
        total["unreclaimable_bytes"] = totals.unreclaimable_bytes();
        total["gpu_bytes"] = tree_gpu_known ? nb::cast(tree_gpu_bytes) : nb::object(nb::none());
        out["total"] = total;
        out["shared_files"] = shared_files_to_dict(held);
        nb::dict system_dict;
        system_dict["mem_total_bytes"] = system.mem_total_bytes;
        system_dict["mem_available_bytes"] = system.mem_available_bytes;
        system_dict["mem_free_bytes"] = system.mem_free_bytes;
        out["system"] = system_dict;
        if (cgroup) {
          nb::dict c;
          c["version"] = cgroup->version;
          c["path"] = cgroup->path;
          c["memory_max_bytes"] = optional_bytes(cgroup->memory_max_bytes);
          c["memory_current_bytes"] = cgroup->memory_current_bytes;
          c["inactive_file_bytes"] = cgroup->inactive_file_bytes;
          c["headroom_bytes"] = optional_bytes(cgroup->headroom_bytes);
          out["cgroup"] = c;
        } else {
          out["cgroup"] = nb::none();
        }
        out["gpu"] = gpus_to_object(gpus);
        return out;
      },
      nb::arg("pid"), nb::arg("tree") = true, nb::arg("root") = "", nb::arg("gpu") = true,
      "Per-process memory of pid (and its descendants when tree), their totals\n"
      "(with fd_shmem and unreclaimable), shared memory held by their descriptors\n"
      "(shared_files: per owner),\n"
      "/proc/meminfo, the process's memory cgroup and NVML GPUs. `root` prefixes\n"
      "every /proc and /sys path (tests use fake trees). Raises FileNotFoundError\n"
      "when pid cannot be read.");

  m.def(
      "available_memory_bytes",
      [](const std::string& root) {
        return MemoryMonitor(MemoryPaths{root}).available_memory_bytes();
      },
      nb::arg("root") = "", nb::call_guard<nb::gil_scoped_release>(),
      "min(MemAvailable, cgroup headroom): what a loader may still take, in bytes.");
  m.def(
      "total_memory_bytes",
      [](const std::string& root) { return MemoryMonitor(MemoryPaths{root}).total_memory_bytes(); },
      nb::arg("root") = "", nb::call_guard<nb::gil_scoped_release>(),
      "min(MemTotal, cgroup memory.max): the memory this process can ever use.");
  m.def(
      "detect_unified_memory",
      [](const std::string& root) {
        UnifiedMemoryDetection detection;
        {
          nb::gil_scoped_release release;
          detection = MemoryMonitor(MemoryPaths{root}).detect_unified_memory();
        }
        return nb::make_tuple(detection.unified, detection.reason);
      },
      nb::arg("root") = "",
      "(unified, reason): LEANLOADER_UNIFIED_MEMORY, a Tegra device tree, or an NVML\n"
      "GPU without separate memory (GB10) or a Grace superchip.");
  m.def(
      "gpu_memory",
      [] {
        std::optional<std::vector<GpuMemory>> gpus;
        {
          nb::gil_scoped_release release;
          gpus = MemoryMonitor().read_gpus();
        }
        return gpus_to_object(gpus);
      },
      "NVML GPUs (index, name, total/used/free bytes) or None without the driver.");
}

}  // namespace leanloader::bindings
