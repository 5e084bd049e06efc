// MemoryMonitor: what a process tree, the system, its cgroup and the GPUs hold.
//
// What is counted (DESIGN §4): per process, from /proc/PID/smaps_rollup,
// RSS, PSS and its split into anonymous / file-backed / shmem, USS (private
// clean + dirty) and swap. Summing PSS over processes counts a shared page
// once (the kernel already divides it among its sharers), so tree totals are
// sums of PSS-based figures, never of RSS. "Unreclaimable" = Pss_Anon +
// Pss_Shmem + shared memory held by the tree's descriptors and not mapped
// (see FdSharedMemory): what the OOM killer and MemAvailable see; Pss_File
// is page cache the kernel can drop and is reported separately.
//
// Limits come from where the kernel enforces them: the effective cgroup limit
// is the smallest memory.max (v2) / memory.limit_in_bytes (v1) on the path
// from the process's cgroup up to the hierarchy's root; MemAvailable, not
// MemFree, is the system's headroom.
//
// Every path is taken relative to MemoryPaths::root ("" = the real machine),
// so tests run the parsers on fake /proc and /sys trees in temp directories.
// A MemoryMonitor holds no open files and no state besides its paths; it is
// safe to use from several threads at once.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace leanloader {

struct MemoryPaths {
  // Prefix for /proc/... and /sys/... (and the cgroup mount points read from
  // /proc/self/mountinfo). Empty = the real root.
  std::string root;
};

// Bytes. Sums over processes are PSS-based and count a shared page once,
// except rss_bytes, which counts it in every process that maps it.
struct ProcessMemory {
  int pid = 0;
  std::string name;  // comm, as in /proc/PID/stat
  uint64_t rss_bytes = 0;
  uint64_t pss_bytes = 0;
  uint64_t pss_anon_bytes = 0;
  uint64_t pss_file_bytes = 0;
  uint64_t pss_shmem_bytes = 0;
  uint64_t uss_bytes = 0;  // Private_Clean + Private_Dirty (+ Private_Hugetlb)
  uint64_t swap_bytes = 0;
  // False when smaps_rollup could not be read (another user's process, a
  // kernel before 4.14) and the figures come from /proc/PID/status: then
  // pss = rss, the split is RssAnon/RssFile/RssShmem and uss = RssAnon.
  bool from_smaps_rollup = true;

  uint64_t unreclaimable_bytes() const { return pss_anon_bytes + pss_shmem_bytes; }
};

// Shared memory (tmpfs pages: unlinked /dev/shm files, memfds) that the
// tree's processes hold open by file descriptor. Such a file's pages stay in
// memory while any descriptor or mapping remains, mapped or not; smaps sees
// only the mapped and faulted part (Pss_Shmem), so a pool of unlinked
// segments that no process maps at a given moment is invisible to it.
//
// How each file is counted once: files are keyed by (device, inode) across
// the whole tree and attributed to the first process (in tree order) holding
// a descriptor to it. A file's held bytes are its allocated size (st_blocks x
// 512: the pages it holds, resident or swapped). Its mapped bytes are its
// pages present in the page table of some process of the tree, each counted
// once however many map it (from /proc/PID/pagemap, read only over the
// mappings of these inodes that /proc/PID/maps names; a private copy of a
// page is not the file's page), which Pss_Shmem already counts. unmapped =
// held - mapped (at least 0) is what tree totals add to Pss_Shmem, so a page
// is counted once whether it is mapped, mapped in part, or only held by a
// descriptor. (A page also mapped outside the tree counts as mapped while
// Pss_Shmem has only the tree's share of it.)
struct SharedFileOwner {
  int pid = 0;
  std::string name;   // comm
  int num_files = 0;  // files attributed to this process
  uint64_t held_bytes = 0;
  uint64_t unmapped_bytes = 0;  // held and not mapped by any process of the tree
};

struct FdSharedMemory {
  int num_files = 0;
  uint64_t held_bytes = 0;
  uint64_t mapped_bytes = 0;            // sum over files of min(held, pages mapped in the tree)
  uint64_t unmapped_bytes = 0;          // held_bytes - mapped_bytes
  std::vector<SharedFileOwner> owners;  // tree order; only processes owning a file
};

struct MemoryTotals {
  uint64_t rss_bytes = 0;
  uint64_t pss_bytes = 0;
  uint64_t pss_anon_bytes = 0;
  uint64_t pss_file_bytes = 0;
  uint64_t pss_shmem_bytes = 0;
  uint64_t uss_bytes = 0;
  uint64_t swap_bytes = 0;
  // Shared memory held by the tree's descriptors and not mapped (set by
  // MemoryMonitor::tree_totals; see FdSharedMemory).
  uint64_t fd_shmem_bytes = 0;
  int num_processes = 0;

  uint64_t unreclaimable_bytes() const { return pss_anon_bytes + pss_shmem_bytes + fd_shmem_bytes; }
  void add(const ProcessMemory& process);
};

// /proc/meminfo.
struct SystemMemory {
  uint64_t mem_total_bytes = 0;
  uint64_t mem_free_bytes = 0;
  // MemAvailable (free + reclaimable page cache and slab); MemFree on kernels
  // older than 3.14 that lack it.
  uint64_t mem_available_bytes = 0;
};

struct CgroupMemory {
  int version = 0;   // 1 or 2
  std::string path;  // the directory of the process's memory cgroup
  // The smallest limit on the path to the root; nullopt = unlimited.
  std::optional<uint64_t> memory_max_bytes;
  // memory.current (v2) / memory.usage_in_bytes (v1) of the process's cgroup.
  uint64_t memory_current_bytes = 0;
  // inactive_file of memory.stat at the process's cgroup: page cache the
  // kernel reclaims before it OOM-kills (v1: total_inactive_file).
  uint64_t inactive_file_bytes = 0;
  // The least, over limited levels of the path, of limit - usage +
  // inactive_file (clamped to [0, limit]); nullopt = no level is limited.
  std::optional<uint64_t> headroom_bytes;
};

struct GpuMemory {
  int index = 0;
  std::string name;
  // False when the driver answers NVML_ERROR_NOT_SUPPORTED for memory info,
  // as on GB10 / unified-memory parts; then total/used/free are 0.
  bool memory_info_supported = true;
  uint64_t total_bytes = 0;
  uint64_t used_bytes = 0;
  uint64_t free_bytes = 0;
  // Processes with a context on this GPU (NVML's compute and graphics lists)
  // and their GPU memory; nullopt bytes where the driver does not say (as
  // under some virtualization). Empty when the driver has no such entry point.
  std::map<uint32_t, std::optional<uint64_t>> process_bytes;
};

// GPU memory of process `pid` summed over `gpus` (0 when it has no context
// on any); nullopt when a GPU lists it without a figure.
std::optional<uint64_t> process_gpu_bytes(const std::vector<GpuMemory>& gpus, int pid);

// How the unified-memory decision was made, for reports and tests.
struct UnifiedMemoryDetection {
  bool unified = false;
  std::string reason;
};

class MemoryMonitor {
 public:
  explicit MemoryMonitor(MemoryPaths paths = {});

  // pid and every live descendant (from the ppid field of /proc/*/stat),
  // pid first, then in breadth-first order. Empty if pid does not exist.
  std::vector<int> process_tree(int pid) const;

  // One process; nullopt if it does not exist, has exited or is a zombie
  // (no address space).
  std::optional<ProcessMemory> read_process(int pid) const;

  // pid alone (tree = false) or with its descendants; processes that exit
  // while being read are left out. Throws IoError (NotFound) if pid itself
  // cannot be read.
  std::vector<ProcessMemory> read_processes(int pid, bool tree) const;

  // Sums over pid and its descendants, skipping processes that exit mid-read
  // (num_processes says how many were counted; 0 if pid is gone), with
  // fd_shmem_bytes as fd_shared_memory() gives it. Reads small files (stat,
  // smaps_rollup, the fd directories; maps, and pagemap over the mappings of
  // descriptor-held files only). The page tables of held files are read
  // before the rollups and after, a page either reading finds counting as
  // mapped: a held file mapped or unmapped while the rollups are read is
  // counted once, not both in Pss_Shmem and as held-unmapped. The kernel's
  // page walks for smaps_rollup are most of the cost: 80 ms for
  // ll.DataLoader's tree of five processes with torch loaded on the 2-core
  // VM (150 ms when smaps was read).
  MemoryTotals tree_totals(int pid) const;

  // Shared memory held by the descriptors of `pids` (see FdSharedMemory).
  // Processes that exit or cannot be read (another user's) are skipped.
  FdSharedMemory fd_shared_memory(const std::vector<int>& pids) const;

  // Throws IoError if /proc/meminfo cannot be read, FormatError if it lacks
  // MemTotal.
  SystemMemory read_system() const;

  // The memory cgroup of pid (0 = this process): v2 when its cgroup has the
  // memory controller, else v1; nullopt when neither can be found.
  std::optional<CgroupMemory> read_cgroup(int pid = 0) const;

  // min(MemAvailable, cgroup headroom): what the loader may still take.
  uint64_t available_memory_bytes() const;

  // min(MemTotal, cgroup limit): the memory this process can ever use.
  uint64_t total_memory_bytes() const;

  // GPUs through NVML (libnvidia-ml.so.1, loaded with dlopen at the first
  // call); nullopt when the library or driver is absent or fails to start.
  // Ignores MemoryPaths (NVML has no file interface).
  std::optional<std::vector<GpuMemory>> read_gpus() const;

  // Whether CPU and GPU share one memory pool, in this order:
  // 1. env LEANLOADER_UNIFIED_MEMORY=1/0 (an explicit override);
  // 2. <root>/proc/device-tree/compatible names "nvidia,tegra" (Jetson);
  // 3. an NVML GPU whose memory info is NOT_SUPPORTED (GB10 / DGX Spark) or
  //    whose name is a Grace-Hopper/Blackwell superchip (GH200, GB200, GB10);
  // 4. otherwise false ("no unified-memory device found").
  UnifiedMemoryDetection detect_unified_memory() const;
  // Steps 1-3 with the GPU list given (nullopt = no NVML), for tests.
  UnifiedMemoryDetection detect_unified_memory(
      const std::optional<std::vector<GpuMemory>>& gpus) const;

  const MemoryPaths& paths() const { return paths_; }

 private:
  std::string proc_path(int pid, const char* file) const;

  MemoryPaths paths_;
};

// MemoryMonitor().available_memory_bytes() on the real machine: what the
// loader calls to size its budget (memory_budget="auto") and to back off.
uint64_t available_memory_bytes();

}  // namespace leanloader
