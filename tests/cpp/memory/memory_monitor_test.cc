// MemoryMonitor on fake /proc and cgroup trees (temp directories), then on
// live processes that allocate, map and share known amounts of memory.
#include "leanloader/memory/memory_monitor.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "leanloader/core/error.h"
#include "test_util.h"

namespace leanloader {
namespace {

namespace fs = std::filesystem;

// ThreadSanitizer maps gigabytes of shadow memory into the process as
// anonymous memory, so live figures cannot be compared with what a test
// allocated. The same tests run in the plain and ASan builds.
#if defined(__SANITIZE_THREAD__)
#define SKIP_LIVE_FIGURES_UNDER_TSAN() \
  GTEST_SKIP() << "ThreadSanitizer's shadow memory is anonymous memory of this process"
#else
#define SKIP_LIVE_FIGURES_UNDER_TSAN() static_cast<void>(0)
#endif

constexpr uint64_t kKiB = 1024;
using testing::kMiB;
constexpr uint64_t kGiB = 1024 * kMiB;

// A fake machine root: write("proc/1/stat", ...) creates the file under it.
class FakeRoot {
 public:
  void write(const std::string& relative, const std::string& content) const {
    const fs::path path = fs::path(root_) / relative;
    fs::create_directories(path.parent_path());
    std::ofstream(path) << content;
  }
  MemoryMonitor monitor() const { return MemoryMonitor(MemoryPaths{root_}); }
  const std::string& path() const { return root_; }

  void add_process(int pid, int ppid, const std::string& name, const std::string& rollup,
                   char state = 'S') const {
    write("proc/" + std::to_string(pid) + "/stat",
          std::to_string(pid) + " (" + name + ") " + state + " " + std::to_string(ppid) +
              " 1 1 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 100 1000 100\n");
    if (!rollup.empty()) write("proc/" + std::to_string(pid) + "/smaps_rollup", rollup);
  }

  void meminfo(uint64_t total_kb, uint64_t free_kb, uint64_t available_kb) const {
    write("proc/meminfo", "MemTotal:       " + std::to_string(total_kb) +
                              " kB\nMemFree:        " + std::to_string(free_kb) +
                              " kB\nMemAvailable:   " + std::to_string(available_kb) +
                              " kB\nBuffers:          1024 kB\n");
  }

 private:
  testing::TempDir dir_;
  const std::string& root_ = dir_.path();
};

// A smaps_rollup as Linux >= 5.7 prints it, figures in kB.
std::string rollup(uint64_t rss, uint64_t pss, uint64_t anon, uint64_t file, uint64_t shmem,
                   uint64_t private_clean, uint64_t private_dirty, uint64_t swap) {
  auto line = [](const char* key, uint64_t kb) {
    std::string text = std::string(key) + ":";
    text.append(16 - text.size(), ' ');
    return text + std::to_string(kb) + " kB\n";
  };
  return "55ea5f139000-7fff355a5000 ---p 00000000 00:00 0                          [rollup]\n" +
         line("Rss", rss) + line("Pss", pss) + line("Pss_Dirty", private_dirty) +
         line("Pss_Anon", anon) + line("Pss_File", file) + line("Pss_Shmem", shmem) +
         line("Shared_Clean", rss - private_clean - private_dirty) + line("Shared_Dirty", 0) +
         line("Private_Clean", private_clean) + line("Private_Dirty", private_dirty) +
         line("Anonymous", anon) + line("Swap", swap) + line("SwapPss", swap) + line("Locked", 0);
}

TEST(MemoryMonitorTest, ProcessTreeFollowsParentPids) {
  FakeRoot root;
  root.add_process(100, 1, "python", rollup(10, 10, 5, 5, 0, 1, 5, 0));
  root.add_process(101, 100, "pt_data_worker", rollup(10, 10, 5, 5, 0, 1, 5, 0));
  root.add_process(102, 101, "odd) (name", rollup(10, 10, 5, 5, 0, 1, 5, 0));
  root.add_process(103, 100, "pt_data_worker", rollup(10, 10, 5, 5, 0, 1, 5, 0));
  root.add_process(200, 1, "unrelated", rollup(10, 10, 5, 5, 0, 1, 5, 0));
  root.write("proc/self/stat", "1 (init) S 0\n");
  const MemoryMonitor monitor = root.monitor();
  EXPECT_EQ(monitor.process_tree(100), (std::vector<int>{100, 101, 103, 102}));
  EXPECT_EQ(monitor.process_tree(101), (std::vector<int>{101, 102}));
  EXPECT_TRUE(monitor.process_tree(999).empty());
  const auto processes = monitor.read_processes(100, true);
  ASSERT_EQ(processes.size(), 4u);
  EXPECT_EQ(processes[3].name, "odd) (name");
  EXPECT_EQ(monitor.read_processes(100, false).size(), 1u);
}

// With CONFIG_PROC_CHILDREN only the tree's own task/*/children files are read.
TEST(MemoryMonitorTest, ProcessTreeFromTaskChildrenFiles) {
  FakeRoot root;
  for (int pid : {100, 101, 102, 103, 200}) {
    root.add_process(pid, 1, "p" + std::to_string(pid), rollup(10, 10, 5, 5, 0, 1, 5, 0));
  }
  // The stat ppids say nothing here (all 1): the children files decide.
  root.write("proc/100/task/100/children", "103 ");
  root.write("proc/100/task/107/children", "101 ");  // a second thread forked 101
  root.write("proc/101/task/101/children", "102 ");
  root.write("proc/102/task/102/children", "");
  root.write("proc/103/task/103/children", "100 ");  // a reused pid must not loop
  const MemoryMonitor monitor = root.monitor();
  EXPECT_EQ(monitor.process_tree(100), (std::vector<int>{100, 101, 103, 102}));
  EXPECT_EQ(monitor.tree_totals(100).num_processes, 4);
}

TEST(MemoryMonitorTest, ReadsSmapsRollupFields) {
  FakeRoot root;
  root.add_process(42, 1, "trainer", rollup(3000, 2000, 1200, 700, 100, 300, 1100, 64));
  const auto memory = root.monitor().read_process(42);
  ASSERT_TRUE(memory.has_value());
  EXPECT_EQ(memory->pid, 42);
  EXPECT_EQ(memory->name, "trainer");
  EXPECT_EQ(memory->rss_bytes, 3000 * kKiB);
  EXPECT_EQ(memory->pss_bytes, 2000 * kKiB);
  EXPECT_EQ(memory->pss_anon_bytes, 1200 * kKiB);
  EXPECT_EQ(memory->pss_file_bytes, 700 * kKiB);
  EXPECT_EQ(memory->pss_shmem_bytes, 100 * kKiB);
  EXPECT_EQ(memory->uss_bytes, 1400 * kKiB);  // private clean + dirty
  EXPECT_EQ(memory->swap_bytes, 64 * kKiB);
  EXPECT_EQ(memory->unreclaimable_bytes(), 1300 * kKiB);
  EXPECT_TRUE(memory->from_smaps_rollup);
}

TEST(MemoryMonitorTest, TreeTotalsSumPssAndSkipVanishedAndZombieProcesses) {
  FakeRoot root;
  root.add_process(10, 1, "main", rollup(1000, 600, 400, 200, 0, 100, 300, 0));
  root.add_process(11, 10, "worker", rollup(900, 500, 300, 100, 100, 50, 250, 8));
  root.add_process(12, 10, "zombie", "", 'Z');
  // 13 is listed as a child but its smaps_rollup and status are gone (exited mid-read).
  root.write("proc/13/stat", "13 (gone) S 10 1 1\n");
  const MemoryTotals totals = root.monitor().tree_totals(10);
  EXPECT_EQ(totals.num_processes, 2);
  EXPECT_EQ(totals.rss_bytes, 1900 * kKiB);
  EXPECT_EQ(totals.pss_bytes, 1100 * kKiB);
  EXPECT_EQ(totals.pss_anon_bytes, 700 * kKiB);
  EXPECT_EQ(totals.pss_file_bytes, 300 * kKiB);
  EXPECT_EQ(totals.pss_shmem_bytes, 100 * kKiB);
  EXPECT_EQ(totals.uss_bytes, 700 * kKiB);
  EXPECT_EQ(totals.swap_bytes, 8 * kKiB);
  EXPECT_EQ(totals.unreclaimable_bytes(), 800 * kKiB);

  EXPECT_EQ(root.monitor().tree_totals(777).num_processes, 0);
  try {
    root.monitor().read_processes(777, true);
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kNotFound);
    EXPECT_NE(std::string(e.what()).find("777"), std::string::npos) << e.what();
  }
}

TEST(MemoryMonitorTest, FallsBackToStatusWithoutSmapsRollup) {
  FakeRoot root;
  root.add_process(50, 1, "other-user", "");
  root.write("proc/50/status",
             "Name:\tother-user\nState:\tS (sleeping)\nVmRSS:\t    2048 kB\nRssAnon:\t    1024 "
             "kB\nRssFile:\t     768 kB\nRssShmem:\t     256 kB\nVmSwap:\t      16 kB\n");
  const auto memory = root.monitor().read_process(50);
  ASSERT_TRUE(memory.has_value());
  EXPECT_FALSE(memory->from_smaps_rollup);
  EXPECT_EQ(memory->rss_bytes, 2048 * kKiB);
  EXPECT_EQ(memory->pss_bytes, 2048 * kKiB);
  EXPECT_EQ(memory->pss_anon_bytes, 1024 * kKiB);
  EXPECT_EQ(memory->pss_file_bytes, 768 * kKiB);
  EXPECT_EQ(memory->pss_shmem_bytes, 256 * kKiB);
  EXPECT_EQ(memory->swap_bytes, 16 * kKiB);
}

TEST(MemoryMonitorTest, KernelWithoutPssSplitUsesAnonymous) {
  FakeRoot root;
  root.add_process(60, 1, "old-kernel", "Rss: 1000 kB\nPss: 800 kB\nAnonymous: 300 kB\n");
  const auto memory = root.monitor().read_process(60);
  ASSERT_TRUE(memory.has_value());
  EXPECT_EQ(memory->pss_anon_bytes, 300 * kKiB);
  EXPECT_EQ(memory->pss_file_bytes, 500 * kKiB);
}

// pain.md A8: MemFree low, page cache high, MemAvailable high -> MemAvailable.
TEST(MemoryMonitorTest, LowMemFreeHighMemAvailableUsesMemAvailable) {
  FakeRoot root;
  root.meminfo(128 * kGiB / kKiB, 10 * kGiB / kKiB, 70 * kGiB / kKiB);
  root.write("proc/self/cgroup", "0::/\n");
  const MemoryMonitor monitor = root.monitor();
  const SystemMemory system = monitor.read_system();
  EXPECT_EQ(system.mem_total_bytes, 128 * kGiB);
  EXPECT_EQ(system.mem_free_bytes, 10 * kGiB);
  EXPECT_EQ(system.mem_available_bytes, 70 * kGiB);
  EXPECT_FALSE(monitor.read_cgroup().has_value());
  EXPECT_EQ(monitor.available_memory_bytes(), 70 * kGiB);
  EXPECT_EQ(monitor.total_memory_bytes(), 128 * kGiB);
}

TEST(MemoryMonitorTest, MeminfoWithoutMemTotalIsAFormatError) {
  FakeRoot root;
  root.write("proc/meminfo", "MemFree: 10 kB\n");
  EXPECT_THROW(root.monitor().read_system(), FormatError);
  FakeRoot empty;
  EXPECT_THROW(empty.monitor().read_system(), IoError);
}

constexpr const char* kMountinfoV2 =
    "30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 "
    "rw,nsdelegate,memory_recursiveprot\n"
    "24 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n";

// A 4 GiB container (docker run --memory=4g) on a 128 GiB host: pain.md A7.
TEST(MemoryMonitorTest, CgroupV2LimitCapsAvailableMemory) {
  FakeRoot root;
  root.meminfo(128 * kGiB / kKiB, 100 * kGiB / kKiB, 120 * kGiB / kKiB);
  root.write("proc/self/cgroup", "0::/docker/abc\n");
  root.write("proc/self/mountinfo", kMountinfoV2);
  root.write("sys/fs/cgroup/docker/abc/memory.max", std::to_string(4 * kGiB) + "\n");
  root.write("sys/fs/cgroup/docker/abc/memory.current", std::to_string(1 * kGiB) + "\n");
  root.write("sys/fs/cgroup/docker/abc/memory.stat", "anon 1000\nfile 5000\ninactive_file 0\n");
  root.write("sys/fs/cgroup/docker/memory.max", "max\n");
  const MemoryMonitor monitor = root.monitor();
  const auto cgroup = monitor.read_cgroup();
  ASSERT_TRUE(cgroup.has_value());
  EXPECT_EQ(cgroup->version, 2);
  EXPECT_EQ(cgroup->path, root.path() + "/sys/fs/cgroup/docker/abc");
  ASSERT_TRUE(cgroup->memory_max_bytes.has_value());
  EXPECT_EQ(*cgroup->memory_max_bytes, 4 * kGiB);
  EXPECT_EQ(cgroup->memory_current_bytes, 1 * kGiB);
  EXPECT_EQ(monitor.available_memory_bytes(), 3 * kGiB);
  EXPECT_EQ(monitor.total_memory_bytes(), 4 * kGiB);
}

TEST(MemoryMonitorTest, CgroupV2MaxMeansNoLimit) {
  FakeRoot root;
  root.meminfo(64 * kGiB / kKiB, 1 * kGiB / kKiB, 30 * kGiB / kKiB);
  root.write("proc/self/cgroup", "0::/user.slice/session\n");
  root.write("proc/self/mountinfo", kMountinfoV2);
  root.write("sys/fs/cgroup/user.slice/session/memory.max", "max\n");
  root.write("sys/fs/cgroup/user.slice/session/memory.current", "123456789\n");
  root.write("sys/fs/cgroup/user.slice/memory.max", "max\n");
  const MemoryMonitor monitor = root.monitor();
  const auto cgroup = monitor.read_cgroup();
  ASSERT_TRUE(cgroup.has_value());
  EXPECT_FALSE(cgroup->memory_max_bytes.has_value());
  EXPECT_FALSE(cgroup->headroom_bytes.has_value());
  EXPECT_EQ(cgroup->memory_current_bytes, 123456789u);
  EXPECT_EQ(monitor.available_memory_bytes(), 30 * kGiB);
}

// The effective limit is the smallest on the path to the root, and a parent
// shared with siblings can have less headroom than the child's own limit.
TEST(MemoryMonitorTest, CgroupV2NestedLimitsTakeTheTightest) {
  FakeRoot root;
  root.meminfo(256 * kGiB / kKiB, 200 * kGiB / kKiB, 240 * kGiB / kKiB);
  root.write("proc/self/cgroup", "0::/kubepods/pod1/ctr\n");
  root.write("proc/self/mountinfo", kMountinfoV2);
  const std::string base = "sys/fs/cgroup/kubepods";
  root.write(base + "/memory.max", std::to_string(64 * kGiB));
  root.write(base + "/memory.current", std::to_string(10 * kGiB));
  root.write(base + "/pod1/memory.max", std::to_string(8 * kGiB));
  root.write(base + "/pod1/memory.current", std::to_string(7 * kGiB));  // sibling uses 5
  root.write(base + "/pod1/ctr/memory.max", std::to_string(16 * kGiB));
  root.write(base + "/pod1/ctr/memory.current", std::to_string(2 * kGiB));
  const auto cgroup = root.monitor().read_cgroup();
  ASSERT_TRUE(cgroup.has_value());
  EXPECT_EQ(*cgroup->memory_max_bytes, 8 * kGiB);
  EXPECT_EQ(cgroup->memory_current_bytes, 2 * kGiB);
  EXPECT_EQ(*cgroup->headroom_bytes, 1 * kGiB);  // pod1: 8 - 7
  EXPECT_EQ(root.monitor().available_memory_bytes(), 1 * kGiB);
}

// Page cache charged to the cgroup is reclaimed before an OOM kill, like
// MemAvailable counts it on the host.
TEST(MemoryMonitorTest, CgroupInactiveFileCountsAsHeadroom) {
  FakeRoot root;
  root.meminfo(64 * kGiB / kKiB, 1 * kGiB / kKiB, 50 * kGiB / kKiB);
  root.write("proc/self/cgroup", "0::/job\n");
  root.write("proc/self/mountinfo", kMountinfoV2);
  root.write("sys/fs/cgroup/job/memory.max", std::to_string(8 * kGiB));
  root.write("sys/fs/cgroup/job/memory.current", std::to_string(7 * kGiB));
  root.write("sys/fs/cgroup/job/memory.stat",
             "anon 1\nactive_file 2\ninactive_file " + std::to_string(3 * kGiB) + "\n");
  const auto cgroup = root.monitor().read_cgroup();
  ASSERT_TRUE(cgroup.has_value());
  EXPECT_EQ(cgroup->inactive_file_bytes, 3 * kGiB);
  EXPECT_EQ(*cgroup->headroom_bytes, 4 * kGiB);  // 8 - (7 - 3)
}

constexpr const char* kMountinfoV1 =
    "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
    "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
    "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";

// Hybrid hierarchy (as on this project's build machine): cgroup2 mounted
// without the memory controller, the memory controller on v1.
TEST(MemoryMonitorTest, CgroupV1WithHybridHierarchyAndUnlimitedSentinel) {
  FakeRoot root;
  root.meminfo(24 * kGiB / kKiB, 20 * kGiB / kKiB, 22 * kGiB / kKiB);
  root.write("proc/self/cgroup", "9:name=systemd:/\n4:memory:/process_api/73bb\n1:cpu:/\n0::/\n");
  root.write("proc/self/mountinfo", kMountinfoV1);
  root.write("sys/fs/cgroup/unified/cgroup.controllers", "");
  const std::string leaf = "sys/fs/cgroup/memory/process_api/73bb";
  root.write(leaf + "/memory.limit_in_bytes", "9223372036854771712\n");
  root.write(leaf + "/memory.usage_in_bytes", "6389760\n");
  root.write(leaf + "/memory.stat", "cache 3465216\ninactive_file 99\ntotal_inactive_file 4096\n");
  root.write("sys/fs/cgroup/memory/process_api/memory.limit_in_bytes",
             std::to_string(6 * kGiB) + "\n");
  root.write("sys/fs/cgroup/memory/process_api/memory.usage_in_bytes",
             std::to_string(1 * kGiB) + "\n");
  root.write("sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
  const MemoryMonitor monitor = root.monitor();
  const auto cgroup = monitor.read_cgroup();
  ASSERT_TRUE(cgroup.has_value());
  EXPECT_EQ(cgroup->version, 1);
  EXPECT_EQ(cgroup->path, root.path() + "/" + leaf);
  EXPECT_EQ(*cgroup->memory_max_bytes, 6 * kGiB);
  EXPECT_EQ(cgroup->memory_current_bytes, 6389760u);
  EXPECT_EQ(cgroup->inactive_file_bytes, 4096u);  // hierarchical figure
  EXPECT_EQ(monitor.available_memory_bytes(), 5 * kGiB);
}

// Inside a container the v1 mount's root is the container's own cgroup.
TEST(MemoryMonitorTest, CgroupV1NamespacedMountRoot) {
  FakeRoot root;
  root.meminfo(64 * kGiB / kKiB, 1 * kGiB / kKiB, 60 * kGiB / kKiB);
  root.write("proc/self/cgroup", "5:memory:/docker/abc\n");
  root.write("proc/self/mountinfo",
             "35 31 0:32 /docker/abc /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory\n");
  root.write("sys/fs/cgroup/memory/memory.limit_in_bytes", std::to_string(2 * kGiB));
  root.write("sys/fs/cgroup/memory/memory.usage_in_bytes", std::to_string(kGiB / 2));
  const auto cgroup = root.monitor().read_cgroup();
  ASSERT_TRUE(cgroup.has_value());
  EXPECT_EQ(cgroup->path, root.path() + "/sys/fs/cgroup/memory");
  EXPECT_EQ(*cgroup->memory_max_bytes, 2 * kGiB);
  EXPECT_EQ(root.monitor().available_memory_bytes(), 3 * kGiB / 2);
}

TEST(MemoryMonitorTest, CgroupOfAnotherProcessAndMissingFiles) {
  FakeRoot root;
  root.write("proc/77/cgroup", "0::/a\n");
  root.write("proc/self/mountinfo", kMountinfoV2);
  root.write("sys/fs/cgroup/a/memory.max", "1000\n");
  root.write("sys/fs/cgroup/a/memory.current", "2000\n");  // over the limit: no headroom
  const auto cgroup = root.monitor().read_cgroup(77);
  ASSERT_TRUE(cgroup.has_value());
  EXPECT_EQ(*cgroup->headroom_bytes, 0u);
  EXPECT_FALSE(root.monitor().read_cgroup(78).has_value());
}

TEST(MemoryMonitorTest, UnifiedMemoryDetection) {
  ::unsetenv("LEANLOADER_UNIFIED_MEMORY");
  FakeRoot plain;
  EXPECT_FALSE(plain.monitor().detect_unified_memory(std::nullopt).unified);
  GpuMemory h100;
  h100.name = "NVIDIA H100 80GB HBM3";
  h100.total_bytes = 80 * kGiB;
  EXPECT_FALSE(plain.monitor().detect_unified_memory(std::vector<GpuMemory>{h100}).unified);

  GpuMemory gb10;
  gb10.name = "NVIDIA GB10";
  gb10.memory_info_supported = false;
  const auto spark = plain.monitor().detect_unified_memory(std::vector<GpuMemory>{gb10});
  EXPECT_TRUE(spark.unified);
  EXPECT_NE(spark.reason.find("not supported"), std::string::npos) << spark.reason;

  GpuMemory gh200;
  gh200.name = "NVIDIA GH200 480GB";
  gh200.total_bytes = 96 * kGiB;
  EXPECT_TRUE(plain.monitor().detect_unified_memory(std::vector<GpuMemory>{gh200}).unified);

  FakeRoot jetson;
  const char compatible[] = "nvidia,p3737-0000+p3701-0000\0nvidia,tegra234";
  jetson.write("proc/device-tree/compatible", std::string(compatible, sizeof(compatible)));
  EXPECT_TRUE(jetson.monitor().detect_unified_memory(std::nullopt).unified);

  ::setenv("LEANLOADER_UNIFIED_MEMORY", "1", 1);
  EXPECT_TRUE(plain.monitor().detect_unified_memory(std::nullopt).unified);
  ::setenv("LEANLOADER_UNIFIED_MEMORY", "0", 1);
  EXPECT_FALSE(jetson.monitor().detect_unified_memory(std::vector<GpuMemory>{gb10}).unified);
  ::unsetenv("LEANLOADER_UNIFIED_MEMORY");
}

// ---- live processes ----------------------------------------------------------

// A child process that runs `setup`, reports ready, and exits when released.
class Child {
 public:
  template <typename Setup>
  explicit Child(Setup setup) {
    int ready[2];
    int release[2];
    if (::pipe(ready) != 0 || ::pipe(release) != 0) throw std::runtime_error("pipe failed");
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      ::close(ready[0]);
      ::close(release[1]);
      setup();
      const char byte = 1;
      if (::write(ready[1], &byte, 1) != 1) ::_exit(2);
      char ignored;
      while (::read(release[0], &ignored, 1) > 0) {
      }
      ::_exit(0);
    }
    ::close(ready[1]);
    ::close(release[0]);
    release_fd_ = release[1];
    char byte = 0;
    const bool ok = ::read(ready[0], &byte, 1) == 1;
    ::close(ready[0]);
    if (!ok) throw std::runtime_error("child failed during setup");
  }
  ~Child() {
    ::close(release_fd_);
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  int pid() const { return pid_; }

 private:
  int pid_ = -1;
  int release_fd_ = -1;
};

void touch_pages(volatile char* data, size_t bytes, bool write) {
  const long page = ::sysconf(_SC_PAGESIZE);
  unsigned sum = 0;
  for (size_t offset = 0; offset < bytes; offset += static_cast<size_t>(page)) {
    if (write) {
      data[offset] = 1;
    } else {
      sum += static_cast<unsigned char>(data[offset]);
    }
  }
  (void)sum;
}

::testing::AssertionResult within_ten_percent(uint64_t measured, uint64_t expected) {
  const double ratio = static_cast<double>(measured) / static_cast<double>(expected);
  if (ratio >= 0.9 && ratio <= 1.1) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << measured << " bytes is not within 10% of " << expected;
}

TEST(MemoryMonitorTest, LiveProcessAnonymousAndFileMappingWithinTenPercent) {
  SKIP_LIVE_FIGURES_UNDER_TSAN();
  const uint64_t anon_bytes = 500 * kMiB;
  const uint64_t file_bytes = 1 * kGiB;
  FakeRoot scratch;  // only for the temp directory
  const std::string file = scratch.path() + "/mapped.bin";
  {
    const int fd = ::open(file.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0600);
    ASSERT_GE(fd, 0);
    std::vector<char> chunk(8 * kMiB, 'x');
    for (uint64_t written = 0; written < file_bytes; written += chunk.size()) {
      ASSERT_EQ(::write(fd, chunk.data(), chunk.size()), static_cast<ssize_t>(chunk.size()));
    }
    ::close(fd);
  }
  Child child([&] {
    void* anon =
        ::mmap(nullptr, anon_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    const int fd = ::open(file.c_str(), O_RDONLY);
    void* mapped = ::mmap(nullptr, file_bytes, PROT_READ, MAP_SHARED, fd, 0);
    if (anon == MAP_FAILED || fd < 0 || mapped == MAP_FAILED) ::_exit(3);
    touch_pages(static_cast<char*>(anon), anon_bytes, true);
    touch_pages(static_cast<char*>(mapped), file_bytes, false);
  });
  const MemoryMonitor monitor;
  const auto memory = monitor.read_process(child.pid());
  ASSERT_TRUE(memory.has_value());
  ASSERT_TRUE(memory->from_smaps_rollup);
  std::printf("live: pss_anon %.1f MiB (500 allocated), pss_file %.1f MiB (1024 mapped)\n",
              memory->pss_anon_bytes / double(kMiB), memory->pss_file_bytes / double(kMiB));
  EXPECT_TRUE(within_ten_percent(memory->pss_anon_bytes, anon_bytes));
  EXPECT_TRUE(within_ten_percent(memory->pss_file_bytes, file_bytes));
  EXPECT_TRUE(within_ten_percent(memory->rss_bytes, anon_bytes + file_bytes));
}

TEST(MemoryMonitorTest, LiveTreeIncludesChildAndCountsSharedPagesOnce) {
  SKIP_LIVE_FIGURES_UNDER_TSAN();
  const uint64_t shared_bytes = 256 * kMiB;
  const uint64_t private_bytes = 64 * kMiB;
  int grandchild_pid = 0;
  int ids[2];
  ASSERT_EQ(::pipe(ids), 0);
  Child parent([&] {
    ::close(ids[0]);
    char* shared = static_cast<char*>(
        ::mmap(nullptr, shared_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
    if (shared == MAP_FAILED) ::_exit(3);
    touch_pages(shared, shared_bytes, true);
    // The grandchild maps the same pages and adds private ones of its own.
    const Child* grandchild = new Child([&] {
      touch_pages(shared, shared_bytes, false);
      char* own = static_cast<char*>(::mmap(nullptr, private_bytes, PROT_READ | PROT_WRITE,
                                            MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
      if (own == MAP_FAILED) ::_exit(3);
      touch_pages(own, private_bytes, true);
    });
    const int id = grandchild->pid();
    if (::write(ids[1], &id, sizeof(id)) != sizeof(id)) ::_exit(4);
    // Leaked on purpose: the grandchild lives until this process exits.
  });
  ::close(ids[1]);
  ASSERT_EQ(::read(ids[0], &grandchild_pid, sizeof(grandchild_pid)),
            static_cast<ssize_t>(sizeof(grandchild_pid)));
  ::close(ids[0]);

  const MemoryMonitor monitor;
  const std::vector<int> tree = monitor.process_tree(parent.pid());
  EXPECT_EQ(tree, (std::vector<int>{parent.pid(), grandchild_pid}));
  const MemoryTotals totals = monitor.tree_totals(parent.pid());
  EXPECT_EQ(totals.num_processes, 2);
  std::printf("live tree: pss_shmem %.1f MiB (256 shared by 2), rss %.1f MiB\n",
              totals.pss_shmem_bytes / double(kMiB), totals.rss_bytes / double(kMiB));
  // Each process maps all 256 MiB: RSS counts them twice, PSS once.
  EXPECT_TRUE(within_ten_percent(totals.pss_shmem_bytes, shared_bytes));
  EXPECT_GE(totals.rss_bytes, 2 * shared_bytes * 9 / 10);
  EXPECT_GE(totals.pss_anon_bytes, private_bytes * 9 / 10);
  EXPECT_GE(totals.unreclaimable_bytes(), (shared_bytes + private_bytes) * 9 / 10);
  EXPECT_LE(totals.unreclaimable_bytes(), (shared_bytes + private_bytes) * 12 / 10);
}

// A memfd of `bytes` with every page allocated, or -1.
int allocated_memfd(uint64_t bytes) {
  const int fd = ::memfd_create("leanloader-test", MFD_CLOEXEC);
  if (fd < 0 || ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)) != 0) return -1;
  return fd;
}

// An unlinked file in /dev/shm of `bytes` with every page allocated, or -1.
int allocated_unlinked_shm(uint64_t bytes) {
  char name[] = "/dev/shm/leanloader-test-XXXXXX";
  const int fd = ::mkstemp(name);
  if (fd < 0) return -1;
  ::unlink(name);
  if (::posix_fallocate(fd, 0, static_cast<off_t>(bytes)) != 0) return -1;
  return fd;
}

TEST(MemoryMonitorTest, LiveSharedMemoryHeldByDescriptorsIsCountedOnce) {
  const uint64_t memfd_bytes = 64 * kMiB;
  const uint64_t shm_bytes = 32 * kMiB;
  int grandchild_pid = 0;
  int ids[2];
  ASSERT_EQ(::pipe(ids), 0);
  // Neither file is mapped by anyone: smaps shows nothing of them. The
  // grandchild inherits both descriptors: still one copy of the memory.
  Child parent([&] {
    ::close(ids[0]);
    if (allocated_memfd(memfd_bytes) < 0 || allocated_unlinked_shm(shm_bytes) < 0) ::_exit(3);
    const Child* grandchild = new Child([] {});
    const int id = grandchild->pid();
    if (::write(ids[1], &id, sizeof(id)) != sizeof(id)) ::_exit(4);
  });
  ::close(ids[1]);
  ASSERT_EQ(::read(ids[0], &grandchild_pid, sizeof(grandchild_pid)),
            static_cast<ssize_t>(sizeof(grandchild_pid)));
  ::close(ids[0]);

  const MemoryMonitor monitor;
  const FdSharedMemory held = monitor.fd_shared_memory(monitor.process_tree(parent.pid()));
  EXPECT_EQ(held.num_files, 2);
  EXPECT_EQ(held.held_bytes, memfd_bytes + shm_bytes);
  EXPECT_EQ(held.mapped_bytes, 0u);
  EXPECT_EQ(held.unmapped_bytes, memfd_bytes + shm_bytes);
  ASSERT_EQ(held.owners.size(), 1u);  // attributed to the first holder only
  EXPECT_EQ(held.owners[0].pid, parent.pid());
  EXPECT_EQ(held.owners[0].num_files, 2);
  EXPECT_EQ(held.owners[0].held_bytes, memfd_bytes + shm_bytes);

  const MemoryTotals totals = monitor.tree_totals(parent.pid());
  EXPECT_EQ(totals.num_processes, 2);
  EXPECT_EQ(totals.fd_shmem_bytes, memfd_bytes + shm_bytes);
  EXPECT_LT(totals.pss_shmem_bytes, 4 * kMiB);  // what smaps alone would have seen
  EXPECT_GE(totals.unreclaimable_bytes(), memfd_bytes + shm_bytes);
}

TEST(MemoryMonitorTest, LiveMappedPartOfAHeldFileIsNotCountedTwice) {
  const uint64_t bytes = 64 * kMiB;
  // The child maps the first half of the memfd and touches it: that half is
  // in Pss_Shmem, the other half only held by the descriptor.
  Child child([&] {
    const int fd = allocated_memfd(bytes);
    if (fd < 0) ::_exit(3);
    void* half = ::mmap(nullptr, bytes / 2, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (half == MAP_FAILED) ::_exit(3);
    touch_pages(static_cast<char*>(half), bytes / 2, true);
  });
  const MemoryMonitor monitor;
  const FdSharedMemory held = monitor.fd_shared_memory({child.pid()});
  EXPECT_EQ(held.held_bytes, bytes);
  EXPECT_TRUE(within_ten_percent(held.mapped_bytes, bytes / 2));
  EXPECT_EQ(held.mapped_bytes + held.unmapped_bytes, bytes);
  const MemoryTotals totals = monitor.tree_totals(child.pid());
  EXPECT_TRUE(within_ten_percent(totals.pss_shmem_bytes, bytes / 2));
  // Mapped half + unmapped half = the file once, plus the process's own anon.
  EXPECT_GE(totals.pss_shmem_bytes + totals.fd_shmem_bytes, bytes);
  EXPECT_LE(totals.pss_shmem_bytes + totals.fd_shmem_bytes, bytes + 2 * kMiB);
}

// A process being torn down (PF_EXITING in its stat flags) has unmapped its
// memory before closing its descriptors: what they hold then is going away,
// and counting it as held-but-unmapped added, for one sample, a second copy
// of pages another reading already had (1 GiB at a bench run's exit).
TEST(MemoryMonitorTest, DescriptorsOfAnExitingProcessHoldNothing) {
  const int fd = ::memfd_create("held-by-a-fake-process", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::posix_fallocate(fd, 0, 1 << 20), 0);
  FakeRoot root;
  const std::string flags_alive = "4194560", flags_exiting = "4194564";  // | PF_EXITING
  for (const auto& [pid, flags] : {std::pair{20, flags_alive}, std::pair{21, flags_exiting}}) {
    root.write("proc/" + std::to_string(pid) + "/stat",
               std::to_string(pid) + " (holder) S 1 1 1 0 -1 " + flags +
                   " 100 0 0 0 0 0 0 0 20 0 1 0 100 1000 100\n");
    const fs::path fd_dir = fs::path(root.path()) / ("proc/" + std::to_string(pid) + "/fd");
    fs::create_directories(fd_dir);
    fs::create_symlink("/proc/self/fd/" + std::to_string(fd), fd_dir / "3");
  }
  const MemoryMonitor monitor = root.monitor();
  EXPECT_EQ(monitor.fd_shared_memory({20}).unmapped_bytes, uint64_t{1} << 20);
  EXPECT_EQ(monitor.fd_shared_memory({21}).unmapped_bytes, 0u);
  EXPECT_EQ(monitor.fd_shared_memory({21}).num_files, 0);
  ::close(fd);
}

// Writes a fake /proc/PID/pagemap: `entries` for the pages from `address`.
void write_pagemap(const FakeRoot& root, int pid, uintptr_t address,
                   const std::vector<uint64_t>& entries) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const fs::path path = fs::path(root.path()) / ("proc/" + std::to_string(pid) + "/pagemap");
  fs::create_directories(path.parent_path());
  std::fstream out(path, std::ios::in | std::ios::out | std::ios::binary);
  if (!out) out.open(path, std::ios::out | std::ios::binary);
  out.seekp(static_cast<std::streamoff>(address / page * sizeof(uint64_t)));
  out.write(reinterpret_cast<const char*>(entries.data()),
            static_cast<std::streamsize>(entries.size() * sizeof(uint64_t)));
}

TEST(MemoryMonitorTest, AHeldFilesPagesMappedByManyProcessesCountOnceFromTheirPageTables) {
  // Process 20 maps the first three quarters of a held file shared, process
  // 21 the second half privately: their page tables (pagemap) together cover
  // every page but two — one 21 never touched, one 21 wrote (an anonymous
  // copy, not the file's page). Summed Pss would depend on when each process
  // was read; the pages mapped do not.
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t pages = 256;
  const int fd = ::memfd_create("mapped-by-two", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::posix_fallocate(fd, 0, static_cast<off_t>(pages * page)), 0);
  struct stat info {};
  ASSERT_EQ(::fstat(fd, &info), 0);
  char device[32];
  std::snprintf(device, sizeof(device), "%02x:%02x", major(info.st_dev), minor(info.st_dev));
  FakeRoot root;
  for (const int pid : {20, 21}) {
    root.write("proc/" + std::to_string(pid) + "/stat",
               std::to_string(pid) +
                   " (holder) S 1 1 1 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 "
                   "100 1000 100\n");
    const fs::path fd_dir = fs::path(root.path()) / ("proc/" + std::to_string(pid) + "/fd");
    fs::create_directories(fd_dir);
    fs::create_symlink("/proc/self/fd/" + std::to_string(fd), fd_dir / "3");
  }
  auto maps_line = [&](uintptr_t start, size_t count, size_t first_page, char kind) {
    char range[64];
    std::snprintf(range, sizeof(range), "%lx-%lx rw-%c %08lx ", static_cast<unsigned long>(start),
                  static_cast<unsigned long>(start + count * page), kind,
                  static_cast<unsigned long>(first_page * page));
    return std::string(range) + device + " " + std::to_string(info.st_ino) +
           " /memfd:mapped-by-two (deleted)\n";
  };
  constexpr uint64_t kPresentFilePage = (uint64_t{1} << 63) | (uint64_t{1} << 61);
  constexpr uint64_t kPresentAnonymous = uint64_t{1} << 63;
  const uintptr_t at20 = 0x10000000;
  const uintptr_t at21 = 0x20000000;
  root.write("proc/20/maps", maps_line(at20, pages * 3 / 4, 0, 's'));
  std::vector<uint64_t> entries20(pages * 3 / 4, kPresentFilePage);
  entries20[7] = kPresentAnonymous;  // a shared huge page mapped whole, as kernels < 6.10 say
  write_pagemap(root, 20, at20, entries20);
  root.write("proc/21/maps", "00400000-00401000 r-xp 00000000 08:01 4242 /usr/bin/python3\n" +
                                 maps_line(at21, pages / 2, pages / 2, 'p'));
  std::vector<uint64_t> entries21(pages / 2, kPresentFilePage);
  entries21[pages / 2 - 2] = 0;                  // never touched
  entries21[pages / 2 - 1] = kPresentAnonymous;  // written privately
  write_pagemap(root, 21, at21, entries21);
  const FdSharedMemory held = root.monitor().fd_shared_memory({20, 21});
  EXPECT_EQ(held.num_files, 1);
  EXPECT_EQ(held.held_bytes, pages * page);
  EXPECT_EQ(held.mapped_bytes, (pages - 2) * page);
  EXPECT_EQ(held.unmapped_bytes, 2 * page);
  ::close(fd);
}

// A file of a fake /proc whose content can change between two readings: a
// FIFO whose writer hands each open the content `next_content()` gives then,
// one reader at a time, until the object is destroyed.
class ChangingFile {
 public:
  ChangingFile(std::string path, std::function<std::string()> next_content)
      : path_(std::move(path)), next_content_(std::move(next_content)) {
    if (::mkfifo(path_.c_str(), 0600) != 0) throw std::runtime_error("mkfifo " + path_);
    // Each reader closes before the next content is offered: an open for
    // writing while the last reader still reads would write to it.
    closes_ = ::inotify_init1(IN_CLOEXEC);
    if (closes_ < 0 || ::inotify_add_watch(closes_, path_.c_str(), IN_CLOSE_NOWRITE) < 0) {
      throw std::runtime_error("inotify on " + path_);
    }
    writer_ = std::thread([this] { serve(); });
  }
  ~ChangingFile() {
    stopping_ = true;
    // A reader that opens lets a writer waiting in open() go on; it sees
    // stopping_ and writes nothing.
    while (!finished_) {
      const int fd = ::open(path_.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (fd >= 0) ::close(fd);
    }
    writer_.join();
    ::close(closes_);
    ::unlink(path_.c_str());
  }
  ChangingFile(const ChangingFile&) = delete;
  ChangingFile& operator=(const ChangingFile&) = delete;
  // How many readings were served.
  size_t served() const { return served_; }

 private:
  void serve() {
    // A reader gone before the write is EPIPE here, not SIGPIPE.
    sigset_t pipe_signal;
    sigemptyset(&pipe_signal);
    sigaddset(&pipe_signal, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_signal, nullptr);
    while (!stopping_) {
      const int fd = ::open(path_.c_str(), O_WRONLY | O_CLOEXEC);  // waits for a reader
      if (fd < 0) break;
      if (stopping_) {
        ::close(fd);
        break;
      }
      const std::string content = next_content_();
      ++served_;  // before the reader can see the end of the file
      [[maybe_unused]] const ssize_t written = ::write(fd, content.data(), content.size());
      ::close(fd);
      for (bool closed = false; !closed && !stopping_;) {
        pollfd event{closes_, POLLIN, 0};
        if (::poll(&event, 1, 10) == 1) {
          char buffer[4096];
          closed = ::read(closes_, buffer, sizeof(buffer)) > 0;
        }
      }
    }
    finished_ = true;
  }

  std::string path_;
  std::function<std::string()> next_content_;
  int closes_ = -1;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> finished_{false};
  std::atomic<size_t> served_{0};
  std::thread writer_;
};

TEST(MemoryMonitorTest, AHeldFileUnmappedWhileTheRollupsAreReadIsCountedOnce) {
  // A program's end: process 30 maps the whole of a 1 MiB memfd when its
  // smaps_rollup is read (Pss_Shmem 1 MiB) and has unmapped it, still holding
  // the descriptor, right after. A page-table reading after the rollups alone
  // would find the file held and unmapped: 2 MiB for a 1 MiB file.
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const int fd = ::memfd_create("unmapped-meanwhile", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::posix_fallocate(fd, 0, 1 << 20), 0);
  struct stat info {};
  ASSERT_EQ(::fstat(fd, &info), 0);
  FakeRoot root;
  root.add_process(30, 1, "python", "");
  const fs::path fd_dir = fs::path(root.path()) / "proc/30/fd";
  fs::create_directories(fd_dir);
  fs::create_symlink("/proc/self/fd/" + std::to_string(fd), fd_dir / "3");
  const uintptr_t at = 0x10000000;
  char line[160];
  std::snprintf(line, sizeof(line), "%lx-%lx rw-s 00000000 %02x:%02x %lu /memfd:x (deleted)\n",
                static_cast<unsigned long>(at), static_cast<unsigned long>(at + (1 << 20)),
                major(info.st_dev), minor(info.st_dev), static_cast<unsigned long>(info.st_ino));
  const std::string mapped_line(line);
  write_pagemap(root, 30, at,
                std::vector<uint64_t>((1 << 20) / page, (uint64_t{1} << 63) | (uint64_t{1} << 61)));
  ChangingFile rollups(root.path() + "/proc/30/smaps_rollup",
                       [] { return rollup(1100, 1100, 76, 0, 1024, 0, 1100, 0); });
  ChangingFile maps(root.path() + "/proc/30/maps",
                    [&] { return rollups.served() == 0 ? mapped_line : std::string(); });
  const MemoryTotals totals = root.monitor().tree_totals(30);
  EXPECT_EQ(totals.num_processes, 1);
  EXPECT_EQ(totals.pss_shmem_bytes, uint64_t{1} << 20);
  EXPECT_EQ(totals.fd_shmem_bytes, 0u);
  EXPECT_EQ(rollups.served(), 1u);
  EXPECT_EQ(maps.served(), 2u);  // before the rollups and after
  ::close(fd);
}

TEST(MemoryMonitorTest, FakeTreesHaveNoDescriptorHeldMemory) {
  const MemoryMonitor monitor(MemoryPaths{"/nonexistent-root"});
  const FdSharedMemory held = monitor.fd_shared_memory({1, 2});
  EXPECT_EQ(held.num_files, 0);
  EXPECT_TRUE(held.owners.empty());
}

TEST(MemoryMonitorTest, LiveMachineReadings) {
  const MemoryMonitor monitor;
  const SystemMemory system = monitor.read_system();
  EXPECT_GT(system.mem_total_bytes, 0u);
  EXPECT_LE(system.mem_available_bytes, system.mem_total_bytes);
  const uint64_t available = available_memory_bytes();
  EXPECT_GT(available, 0u);
  EXPECT_LE(available, system.mem_total_bytes);
  EXPECT_LE(monitor.total_memory_bytes(), system.mem_total_bytes);
  const auto self = monitor.read_process(::getpid());
  ASSERT_TRUE(self.has_value());
  EXPECT_GT(self->pss_bytes, 0u);
  EXPECT_GE(self->rss_bytes, self->pss_bytes);
  // NVML is absent on most CI machines; either answer is fine, but it must not throw.
  EXPECT_NO_THROW(monitor.read_gpus());
}

}  // namespace
}  // namespace leanloader
