#include "leanloader/memory/memory_monitor.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "core/page_size.h"
#include "io/file_io.h"
#include "io/pagemap.h"
#include "io/proc_maps.h"
#include "leanloader/core/error.h"
#include "memory/memory_nvml.h"

namespace leanloader {

namespace {

// v1 reports "no limit" as PAGE_COUNTER_MAX pages (0x7FFFFFFFFFFFF000 with
// 4 KiB pages); anything this large is no limit on any real machine.
constexpr uint64_t kCgroupV1Unlimited = uint64_t{1} << 62;

// Reads a whole small /proc or /sys file. Returns false with errno set when
// it cannot be opened or read (a process that exited gives ENOENT or ESRCH).
bool read_file(const std::string& path, std::string& out) {
  out.clear();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buffer[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0) {
      if (errno == EINTR) continue;
      const int saved = errno;
      ::close(fd);
      errno = saved;
      return false;
    }
    if (n == 0) break;
    out.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  return true;
}

bool path_exists(const std::string& path) {
  struct stat info;
  return ::stat(path.c_str(), &info) == 0;
}

std::string_view trim(std::string_view text) {
  const auto is_space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (!text.empty() && is_space(text.front())) text.remove_prefix(1);
  while (!text.empty() && is_space(text.back())) text.remove_suffix(1);
  return text;
}

std::optional<uint64_t> parse_u64(std::string_view text) {
  text = trim(text);
  uint64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end == text.data()) return std::nullopt;
  return value;
}

// Calls fn(key, value) for each "Key:   value [kB]" line; value is in bytes
// when the line ends in kB. Lines that do not parse are skipped (the
// smaps_rollup header line, for one).
template <typename Fn>
void for_each_field(std::string_view text, Fn&& fn) {
  while (!text.empty()) {
    const size_t newline = text.find('\n');
    std::string_view line = text.substr(0, newline);
    text = newline == std::string_view::npos ? std::string_view() : text.substr(newline + 1);
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    const std::string_view key = line.substr(0, colon);
    std::string_view rest = trim(line.substr(colon + 1));
    uint64_t multiplier = 1;
    if (rest.size() > 2 && rest.substr(rest.size() - 2) == "kB") {
      multiplier = 1024;
      rest = trim(rest.substr(0, rest.size() - 2));
    }
    if (const auto value = parse_u64(rest)) fn(key, *value * multiplier);
  }
}

// "pid (comm) S ppid ...": comm may hold spaces and ')', so split at the last ')'.
struct StatLine {
  std::string name;
  int ppid = 0;
  char state = '?';
  uint64_t flags = 0;  // the kernel's PF_* flags of the task
};

// PF_EXITING: the process is being torn down (its mappings go before its
// descriptors do).
constexpr uint64_t kProcessExiting = 0x4;

std::optional<StatLine> parse_stat(std::string_view text) {
  const size_t open = text.find('(');
  const size_t close = text.rfind(')');
  if (open == std::string_view::npos || close == std::string_view::npos || close < open ||
      close + 4 > text.size()) {
    return std::nullopt;
  }
  StatLine line;
  line.name = std::string(text.substr(open + 1, close - open - 1));
  std::string_view rest = text.substr(close + 2);  // "S ppid ..."
  line.state = rest.front();
  rest = rest.substr(std::min<size_t>(2, rest.size()));
  const size_t space = rest.find(' ');
  const auto ppid = parse_u64(rest.substr(0, space));
  if (!ppid) return std::nullopt;
  line.ppid = static_cast<int>(*ppid);
  // pgrp session tty_nr tpgid flags: the fifth field after ppid (tty_nr and
  // tpgid may be negative, so they are skipped, not parsed).
  std::string_view fields =
      space == std::string_view::npos ? std::string_view() : rest.substr(space + 1);
  for (int skipped = 0; skipped < 4 && !fields.empty(); ++skipped) {
    const size_t next = fields.find(' ');
    fields = next == std::string_view::npos ? std::string_view() : fields.substr(next + 1);
  }
  if (const auto flags = parse_u64(fields.substr(0, fields.find(' ')))) line.flags = *flags;
  return line;
}

bool all_digits(const char* name) {
  if (*name == '\0') return false;
  for (const char* c = name; *c; ++c) {
    if (*c < '0' || *c > '9') return false;
  }
  return true;
}

std::string parent_dir(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos || slash == 0) return "/";
  return path.substr(0, slash);
}

struct CgroupMount {
  std::string root;         // the hierarchy path mounted there ("/" unless namespaced)
  std::string mount_point;  // where it is mounted
};

struct CgroupMounts {
  std::optional<CgroupMount> v2;
  std::optional<CgroupMount> v1_memory;
};

// From /proc/self/mountinfo: "id parent maj:min root mountpoint opts ... - fstype src superopts".
CgroupMounts find_cgroup_mounts(const std::string& mountinfo_path) {
  CgroupMounts mounts;
  std::string text;
  if (!read_file(mountinfo_path, text)) {
    // No mountinfo (a fake tree, an odd sandbox): assume the usual places.
    mounts.v2 = CgroupMount{"/", "/sys/fs/cgroup"};
    mounts.v1_memory = CgroupMount{"/", "/sys/fs/cgroup/memory"};
    return mounts;
  }
  std::string_view view = text;
  while (!view.empty()) {
    const size_t newline = view.find('\n');
    const std::string_view line = view.substr(0, newline);
    view = newline == std::string_view::npos ? std::string_view() : view.substr(newline + 1);
    std::vector<std::string_view> fields;
    size_t start = 0;
    while (start < line.size()) {
      size_t end = line.find(' ', start);
      if (end == std::string_view::npos) end = line.size();
      fields.push_back(line.substr(start, end - start));
      start = end + 1;
    }
    const auto dash = std::find(fields.begin(), fields.end(), "-");
    if (fields.size() < 5 || dash == fields.end() || dash + 1 == fields.end()) continue;
    const std::string_view fstype = *(dash + 1);
    const std::string_view super_options = dash + 3 < fields.end() ? *(dash + 3) : "";
    CgroupMount mount{std::string(fields[3]), std::string(fields[4])};
    if (fstype == "cgroup2" && !mounts.v2) {
      mounts.v2 = mount;
    } else if (fstype == "cgroup" && !mounts.v1_memory) {
      // "rw,memory" -- match the option exactly, not "memory_recursiveprot".
      std::string_view options = super_options;
      while (!options.empty()) {
        const size_t comma = options.find(',');
        if (options.substr(0, comma) == "memory") {
          mounts.v1_memory = mount;
          break;
        }
        options = comma == std::string_view::npos ? std::string_view() : options.substr(comma + 1);
      }
    }
  }
  return mounts;
}

// The directory of a cgroup path under a mount, as seen from `root`.
std::string cgroup_dir(const std::string& root, const CgroupMount& mount,
                       std::string_view cgroup_path) {
  std::string relative(cgroup_path);
  if (mount.root != "/" && relative.rfind(mount.root, 0) == 0) {
    relative = relative.substr(mount.root.size());
  }
  if (relative == "/") relative.clear();
  const std::string base = root + mount.mount_point;
  std::string dir = base + relative;
  // Inside a cgroup namespace the path can name a cgroup outside the mount;
  // the mount point is then the process's own cgroup.
  if (!path_exists(dir)) dir = base;
  return dir;
}

std::optional<uint64_t> read_u64_file(const std::string& path) {
  std::string text;
  if (!read_file(path, text)) return std::nullopt;
  return parse_u64(text);
}

// Limit at one level: nullopt = no file or no limit.
std::optional<uint64_t> read_limit(const std::string& dir, int version) {
  std::string text;
  if (version == 2) {
    if (!read_file(dir + "/memory.max", text) || trim(text) == "max") return std::nullopt;
    return parse_u64(text);
  }
  const auto limit = read_u64_file(dir + "/memory.limit_in_bytes");
  if (!limit || *limit >= kCgroupV1Unlimited) return std::nullopt;
  return limit;
}

std::optional<uint64_t> read_usage(const std::string& dir, int version) {
  return read_u64_file(dir + (version == 2 ? "/memory.current" : "/memory.usage_in_bytes"));
}

uint64_t read_inactive_file(const std::string& dir, int version) {
  std::string text;
  if (!read_file(dir + "/memory.stat", text)) return 0;
  // v1's inactive_file is this cgroup alone; total_ includes its children,
  // like usage_in_bytes does.
  const std::string_view wanted = version == 2 ? "inactive_file" : "total_inactive_file";
  uint64_t value = 0;
  std::string_view view = text;
  while (!view.empty()) {
    const size_t newline = view.find('\n');
    const std::string_view line = view.substr(0, newline);
    view = newline == std::string_view::npos ? std::string_view() : view.substr(newline + 1);
    const size_t space = line.find(' ');
    if (space != std::string_view::npos && line.substr(0, space) == wanted) {
      value = parse_u64(line.substr(space + 1)).value_or(0);
    }
  }
  return value;
}

// Walks from the cgroup's directory up to the mount point. nullopt when the
// process's own cgroup shows no usage file (the root of the hierarchy, or a
// v2 hierarchy without the memory controller).
std::optional<CgroupMemory> read_cgroup_hierarchy(const std::string& dir, const std::string& top,
                                                  int version) {
  const auto usage = read_usage(dir, version);
  const auto leaf_limit = read_limit(dir, version);
  if (!usage && !leaf_limit) return std::nullopt;
  CgroupMemory cgroup;
  cgroup.version = version;
  cgroup.path = dir;
  cgroup.memory_current_bytes = usage.value_or(0);
  cgroup.inactive_file_bytes = read_inactive_file(dir, version);
  std::string level = dir;
  for (;;) {
    if (const auto limit = read_limit(level, version)) {
      const uint64_t level_usage =
          level == dir ? usage.value_or(0) : read_usage(level, version).value_or(0);
      const uint64_t reclaimable =
          level == dir ? cgroup.inactive_file_bytes : read_inactive_file(level, version);
      const uint64_t used = level_usage > reclaimable ? level_usage - reclaimable : 0;
      const uint64_t headroom = used < *limit ? *limit - used : 0;
      cgroup.memory_max_bytes = std::min(cgroup.memory_max_bytes.value_or(*limit), *limit);
      cgroup.headroom_bytes = std::min(cgroup.headroom_bytes.value_or(headroom), headroom);
    }
    if (level.size() <= top.size() || level == top) break;
    level = parent_dir(level);
  }
  return cgroup;
}

ProcessMemory from_smaps_rollup(std::string_view text, bool& has_rss) {
  ProcessMemory memory;
  bool has_pss_anon = false;
  uint64_t anonymous = 0;
  for_each_field(text, [&](std::string_view key, uint64_t value) {
    if (key == "Rss") {
      memory.rss_bytes = value;
      has_rss = true;
    } else if (key == "Pss") {
      memory.pss_bytes = value;
    } else if (key == "Pss_Anon") {
      memory.pss_anon_bytes = value;
      has_pss_anon = true;
    } else if (key == "Pss_File") {
      memory.pss_file_bytes = value;
    } else if (key == "Pss_Shmem") {
      memory.pss_shmem_bytes = value;
    } else if (key == "Private_Clean" || key == "Private_Dirty" || key == "Private_Hugetlb") {
      memory.uss_bytes += value;
    } else if (key == "Swap") {
      memory.swap_bytes = value;
    } else if (key == "Anonymous") {
      anonymous = value;
    }
  });
  if (!has_pss_anon) {
    // Kernels 4.14-5.6 have no Pss_* split: take anonymous RSS (shared
    // anonymous pages counted whole) and leave the rest of PSS to files.
    memory.pss_anon_bytes = std::min(anonymous, memory.pss_bytes);
    memory.pss_file_bytes = memory.pss_bytes - memory.pss_anon_bytes;
  }
  return memory;
}

// The children of pid, sorted, from /proc/PID/task/*/children (each thread
// lists the children it forked). nullopt when the main thread has no such
// file: the kernel lacks CONFIG_PROC_CHILDREN, or pid has exited.
std::optional<std::vector<int>> children_from_tasks(const std::string& proc, int pid) {
  const std::string task_dir = proc + "/" + std::to_string(pid) + "/task";
  if (!path_exists(task_dir + "/" + std::to_string(pid) + "/children")) return std::nullopt;
  std::vector<int> children;
  std::vector<detail::DirectoryEntry> tasks;
  try {
    tasks = detail::list_directory(task_dir);
  } catch (const IoError&) {
    return children;  // exited just now
  }
  std::string text;
  for (const detail::DirectoryEntry& entry : tasks) {
    if (!all_digits(entry.name.c_str())) continue;
    if (!read_file(task_dir + "/" + entry.name + "/children", text)) continue;
    std::string_view view = text;
    while (!view.empty()) {
      const size_t space = view.find(' ');
      if (const auto child = parse_u64(view.substr(0, space))) {
        children.push_back(static_cast<int>(*child));
      }
      view = space == std::string_view::npos ? std::string_view() : view.substr(space + 1);
    }
  }
  std::sort(children.begin(), children.end());
  return children;
}

// Steps 1-2 of detect_unified_memory: the override, then the device tree.
std::optional<UnifiedMemoryDetection> detect_from_files(const std::string& root) {
  if (const char* value = std::getenv("LEANLOADER_UNIFIED_MEMORY"); value && *value) {
    const std::string_view text = value;
    const bool unified = !(text == "0" || text == "false" || text == "no" || text == "off");
    return UnifiedMemoryDetection{unified, std::string("LEANLOADER_UNIFIED_MEMORY=") + value};
  }
  std::string text;
  if (read_file(root + "/proc/device-tree/compatible", text) &&
      std::string_view(text).find("nvidia,tegra") != std::string_view::npos) {
    return UnifiedMemoryDetection{
        true, "device tree: NVIDIA Tegra (Jetson) shares system memory with its GPU"};
  }
  return std::nullopt;
}

std::string proc_file(const std::string& root, int pid, const char* file) {
  return root + "/proc/" + (pid > 0 ? std::to_string(pid) : std::string("self")) + "/" + file;
}

struct FileKey {
  uint64_t major = 0;
  uint64_t minor = 0;
  uint64_t inode = 0;
  bool operator==(const FileKey& other) const {
    return major == other.major && minor == other.minor && inode == other.inode;
  }
};

struct FileKeyHash {
  size_t operator()(const FileKey& key) const {
    return std::hash<uint64_t>()(key.inode * 1000003u ^ (key.major << 20) ^ key.minor);
  }
};

// Whether the file an fd link points to is shared memory that lives as long
// as a descriptor does: a memfd, or an unlinked regular file on tmpfs.
bool is_held_shared_memory(const std::string& link, const std::string& target,
                           const struct stat& info) {
  if (!S_ISREG(info.st_mode)) return false;
  if (target.rfind("/memfd:", 0) == 0) return true;
  if (info.st_nlink != 0) return false;
  struct statfs fs;
  if (::statfs(link.c_str(), &fs) != 0) return false;
  return static_cast<uint64_t>(fs.f_type) == TMPFS_MAGIC;
}

// The shared-memory files a set of processes holds by descriptor
// (FdSharedMemory), and which of their pages those processes map.
class HeldFiles {
 public:
  explicit HeldFiles(const std::string& root) : root_(root), page_(detail::page_size()) {}

  // The descriptor pass: every held file, keyed by (device, inode), owned by
  // the first process (in `pids` order) holding it.
  void find(const std::vector<int>& pids);
  // A page-table pass: marks the pages of held files that each process has
  // in its page table. Passes accumulate: a page any pass found is mapped.
  void mark_mapped(const std::vector<int>& pids);
  FdSharedMemory result() const;

 private:
  struct HeldFile {
    size_t owner = 0;  // index into owners_
    uint64_t held_bytes = 0;
    uint64_t pages = 0;  // of its size: a page beyond cannot be mapped
    // One bit a page, grown as far as the highest page found mapped: a page
    // two processes map counts once, and what each process maps is read
    // from its own page table, so another process's unmapping cannot make
    // it look half mapped (as summed Pss did).
    std::vector<uint64_t> mapped;
    uint64_t mapped_pages = 0;
    void mark(uint64_t page_index);
  };

  std::string root_;
  uint64_t page_;
  std::unordered_map<FileKey, HeldFile, FileKeyHash> files_;
  std::vector<FileKey> order_;
  std::vector<SharedFileOwner> owners_;
};

void HeldFiles::HeldFile::mark(uint64_t page_index) {
  if (page_index >= pages) return;
  const uint64_t word = page_index / 64;
  if (word >= mapped.size()) mapped.resize(word + 1, 0);
  const uint64_t bit = uint64_t{1} << (page_index % 64);
  if ((mapped[word] & bit) == 0) {
    mapped[word] |= bit;
    ++mapped_pages;
  }
}

void HeldFiles::find(const std::vector<int>& pids) {
  std::string text;
  for (int pid : pids) {
    // A process tearing down has unmapped its memory and not yet closed its
    // descriptors: counting what they hold as unmapped would add, for that
    // instant, pages another process (or its own last reading) already
    // counts. Its memory is going away; it holds none.
    std::string name;  // comm, for the owner's line
    if (read_file(proc_file(root_, pid, "stat"), text)) {
      const auto stat = parse_stat(text);
      if (stat && (stat->flags & kProcessExiting) != 0) continue;
      if (stat) name = stat->name;
    }
    const std::string fd_dir = proc_file(root_, pid, "fd");
    std::vector<detail::DirectoryEntry> descriptors;
    try {
      descriptors = detail::list_directory(fd_dir);
    } catch (const IoError&) {
      continue;  // exited, or another user's process
    }
    std::optional<size_t> owner;
    for (const detail::DirectoryEntry& entry : descriptors) {
      if (!all_digits(entry.name.c_str())) continue;
      const std::string link = fd_dir + "/" + entry.name;
      char target[4096];
      const ssize_t length = ::readlink(link.c_str(), target, sizeof(target) - 1);
      if (length <= 0) continue;
      const std::string target_text(target, static_cast<size_t>(length));
      struct stat info;
      if (::stat(link.c_str(), &info) != 0) continue;  // closed meanwhile
      if (!is_held_shared_memory(link, target_text, info)) continue;
      const FileKey key{major(info.st_dev), minor(info.st_dev), info.st_ino};
      if (files_.count(key) != 0) continue;  // counted once, with its first holder
      if (!owner) {
        SharedFileOwner added;
        added.pid = pid;
        added.name = name;
        owners_.push_back(std::move(added));
        owner = owners_.size() - 1;
      }
      HeldFile held;
      held.owner = *owner;
      held.held_bytes = static_cast<uint64_t>(info.st_blocks) * 512u;
      held.pages = (static_cast<uint64_t>(std::max<off_t>(info.st_size, 0)) + page_ - 1) / page_;
      files_.emplace(key, std::move(held));
      order_.push_back(key);
    }
  }
}

void HeldFiles::mark_mapped(const std::vector<int>& pids) {
  if (files_.empty()) return;
  struct Mapping {
    HeldFile* file;
    uintptr_t start;
    uintptr_t end;
    uint64_t offset;
    bool shared;
  };
  std::vector<Mapping> mappings;
  std::vector<uint64_t> entries;
  std::string text;
  for (int pid : pids) {
    // maps (no page walk) names the mappings of held files; pagemap, read
    // over those alone, says which of their pages are in the page table.
    if (!read_file(proc_file(root_, pid, "maps"), text)) continue;
    mappings.clear();
    std::string_view rest(text);
    while (!rest.empty()) {
      const size_t newline = rest.find('\n');
      const auto line = detail::parse_maps_line(rest.substr(0, newline));
      rest = newline == std::string_view::npos ? std::string_view() : rest.substr(newline + 1);
      if (!line || line->inode == 0) continue;
      const auto found = files_.find(FileKey{line->major, line->minor, line->inode});
      if (found == files_.end()) continue;
      const bool shared = line->perms.size() == 4 && line->perms[3] == 's';
      mappings.push_back({&found->second, line->start, line->end, line->offset, shared});
    }
    if (mappings.empty()) continue;
    const std::unique_ptr<detail::File> pagemap =
        detail::open_pagemap(proc_file(root_, pid, "pagemap"));
    if (pagemap == nullptr) continue;  // exited, or another user's process
    for (const Mapping& mapping : mappings) {
      detail::for_each_pagemap_entry(
          pagemap->fd(), mapping.start, mapping.end, page_, entries,
          [&](uintptr_t at, uint64_t entry) {
            // A shared mapping's present pages are the file's. (Kernels
            // before 6.10 leave the file bit off a huge page mapped whole.)
            // In a private one a page written since is an anonymous copy.
            if ((entry & detail::kPagePresent) != 0 &&
                (mapping.shared || (entry & detail::kPageFileOrShared) != 0)) {
              mapping.file->mark((mapping.offset + (at - mapping.start)) / page_);
            }
            return true;
          });
    }
  }
}

FdSharedMemory HeldFiles::result() const {
  FdSharedMemory result;
  result.owners = owners_;
  for (const FileKey& key : order_) {
    const HeldFile& file = files_.at(key);
    const uint64_t mapped = std::min(file.mapped_pages * page_, file.held_bytes);
    SharedFileOwner& owner = result.owners[file.owner];
    owner.num_files += 1;
    owner.held_bytes += file.held_bytes;
    owner.unmapped_bytes += file.held_bytes - mapped;
    result.num_files += 1;
    result.held_bytes += file.held_bytes;
    result.mapped_bytes += mapped;
    result.unmapped_bytes += file.held_bytes - mapped;
  }
  return result;
}

}  // namespace

void MemoryTotals::add(const ProcessMemory& process) {
  rss_bytes += process.rss_bytes;
  pss_bytes += process.pss_bytes;
  pss_anon_bytes += process.pss_anon_bytes;
  pss_file_bytes += process.pss_file_bytes;
  pss_shmem_bytes += process.pss_shmem_bytes;
  uss_bytes += process.uss_bytes;
  swap_bytes += process.swap_bytes;
  num_processes += 1;
}

MemoryMonitor::MemoryMonitor(MemoryPaths paths) : paths_(std::move(paths)) {}

std::string MemoryMonitor::proc_path(int pid, const char* file) const {
  return proc_file(paths_.root, pid, file);
}

std::vector<int> MemoryMonitor::process_tree(int pid) const {
  std::string text;
  if (pid <= 0 || !read_file(proc_path(pid, "stat"), text)) return {};
  const std::string proc = paths_.root + "/proc";
  std::vector<int> tree{pid};
  std::unordered_set<int> seen{pid};  // a reused pid must not loop the walk
  // Cheap path: only the tree's own /proc/PID/task/*/children files. A kernel
  // without CONFIG_PROC_CHILDREN (and most fake trees) has none; then every
  // /proc/*/stat is read for its ppid.
  if (auto first = children_from_tasks(proc, pid)) {
    for (size_t i = 0; i < tree.size(); ++i) {
      const std::vector<int> children =
          i == 0 ? std::move(*first)
                 : children_from_tasks(proc, tree[i]).value_or(std::vector<int>{});
      for (int child : children) {
        if (seen.insert(child).second) tree.push_back(child);
      }
    }
    return tree;
  }
  std::unordered_map<int, std::vector<int>> children;
  for (const detail::DirectoryEntry& entry : detail::list_directory(proc)) {
    if (!all_digits(entry.name.c_str())) continue;
    // A process that exits between readdir and read is simply not there.
    if (!read_file(proc + "/" + entry.name + "/stat", text)) continue;
    if (const auto stat = parse_stat(text)) {
      children[stat->ppid].push_back(std::atoi(entry.name.c_str()));
    }
  }
  for (size_t i = 0; i < tree.size(); ++i) {
    const auto found = children.find(tree[i]);
    if (found == children.end()) continue;
    std::vector<int> sorted = found->second;
    std::sort(sorted.begin(), sorted.end());
    for (int child : sorted) {
      if (seen.insert(child).second) tree.push_back(child);
    }
  }
  return tree;
}

std::optional<ProcessMemory> MemoryMonitor::read_process(int pid) const {
  std::string text;
  if (!read_file(proc_path(pid, "stat"), text)) return std::nullopt;
  const auto stat = parse_stat(text);
  if (!stat || stat->state == 'Z' || stat->state == 'X') return std::nullopt;

  std::optional<ProcessMemory> memory;
  if (read_file(proc_path(pid, "smaps_rollup"), text)) {
    bool has_rss = false;
    ProcessMemory parsed = from_smaps_rollup(text, has_rss);
    if (has_rss) memory = parsed;
  } else if (errno == ENOENT || errno == ESRCH) {
    // Exited, unless the kernel predates smaps_rollup: status tells which.
    if (!path_exists(proc_path(pid, "status"))) return std::nullopt;
  }
  if (!memory) {
    // No permission (another user's process) or no smaps_rollup: /proc/PID/status
    // is world-readable and gives RSS by kind.
    if (!read_file(proc_path(pid, "status"), text)) return std::nullopt;
    ProcessMemory fallback;
    fallback.from_smaps_rollup = false;
    bool has_rss = false;
    for_each_field(text, [&](std::string_view key, uint64_t value) {
      if (key == "VmRSS") {
        fallback.rss_bytes = value;
        has_rss = true;
      } else if (key == "RssAnon") {
        fallback.pss_anon_bytes = value;
      } else if (key == "RssFile") {
        fallback.pss_file_bytes = value;
      } else if (key == "RssShmem") {
        fallback.pss_shmem_bytes = value;
      } else if (key == "VmSwap") {
        fallback.swap_bytes = value;
      }
    });
    if (!has_rss) return std::nullopt;  // no address space: a zombie or kernel thread
    fallback.pss_bytes = fallback.rss_bytes;
    fallback.uss_bytes = fallback.pss_anon_bytes;
    memory = fallback;
  }
  memory->pid = pid;
  memory->name = stat->name;
  return memory;
}

std::vector<ProcessMemory> MemoryMonitor::read_processes(int pid, bool tree) const {
  std::vector<ProcessMemory> processes;
  const std::vector<int> pids = tree ? process_tree(pid) : std::vector<int>{pid};
  for (int member : pids) {
    if (auto memory = read_process(member)) processes.push_back(std::move(*memory));
  }
  if (processes.empty() || processes.front().pid != pid) {
    throw IoError("cannot read the memory of process " + std::to_string(pid),
                  proc_path(pid, "smaps_rollup"), ENOENT);
  }
  return processes;
}

MemoryTotals MemoryMonitor::tree_totals(int pid) const {
  // The rollups and the page tables of held files are read one after the
  // other, so a held file mapped or unmapped meanwhile could be counted in
  // neither reading or in both: in the rollups' Pss_Shmem and as held but
  // unmapped (a program's end: its 1 GiB shared copy unmapped before the
  // descriptor closed read as 2 GiB for one sample). So the page tables are
  // read before the rollups and after: a page either reading finds mapped
  // counts as mapped, and a mapping that comes or goes while the rollups
  // are read is counted once (or, for an instant, not at all: a sample can
  // be low, not high), unless it both came and went between the two.
  const std::vector<int> tree = process_tree(pid);
  HeldFiles held(paths_.root);
  held.find(tree);
  held.mark_mapped(tree);
  MemoryTotals totals;
  for (int member : tree) {
    if (const auto memory = read_process(member)) totals.add(*memory);
  }
  held.mark_mapped(tree);
  totals.fd_shmem_bytes = held.result().unmapped_bytes;
  return totals;
}

FdSharedMemory MemoryMonitor::fd_shared_memory(const std::vector<int>& pids) const {
  HeldFiles held(paths_.root);
  held.find(pids);
  held.mark_mapped(pids);
  return held.result();
}

SystemMemory MemoryMonitor::read_system() const {
  const std::string path = paths_.root + "/proc/meminfo";
  std::string text;
  if (!read_file(path, text)) throw IoError("cannot read", path, errno);
  SystemMemory memory;
  bool has_total = false;
  bool has_available = false;
  for_each_field(text, [&](std::string_view key, uint64_t value) {
    if (key == "MemTotal") {
      memory.mem_total_bytes = value;
      has_total = true;
    } else if (key == "MemFree") {
      memory.mem_free_bytes = value;
    } else if (key == "MemAvailable") {
      memory.mem_available_bytes = value;
      has_available = true;
    }
  });
  if (!has_total) throw FormatError("no MemTotal line in '" + path + "'");
  if (!has_available) memory.mem_available_bytes = memory.mem_free_bytes;
  return memory;
}

std::optional<CgroupMemory> MemoryMonitor::read_cgroup(int pid) const {
  std::string text;
  if (!read_file(proc_path(pid, "cgroup"), text)) return std::nullopt;
  std::optional<std::string> v2_path;
  std::optional<std::string> v1_path;
  std::string_view view = text;
  while (!view.empty()) {
    const size_t newline = view.find('\n');
    const std::string_view line = view.substr(0, newline);
    view = newline == std::string_view::npos ? std::string_view() : view.substr(newline + 1);
    // "hierarchy-id:controllers:path"; the path may itself contain ':'.
    const size_t first = line.find(':');
    const size_t second = first == std::string_view::npos ? first : line.find(':', first + 1);
    if (second == std::string_view::npos) continue;
    const std::string_view id = line.substr(0, first);
    const std::string_view controllers = line.substr(first + 1, second - first - 1);
    const std::string path(line.substr(second + 1));
    if (id == "0" && controllers.empty()) {
      v2_path = path;
      continue;
    }
    std::string_view list = controllers;
    while (!list.empty()) {
      const size_t comma = list.find(',');
      if (list.substr(0, comma) == "memory") v1_path = path;
      list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
    }
  }
  const CgroupMounts mounts = find_cgroup_mounts(proc_path(0, "mountinfo"));
  if (v2_path && mounts.v2) {
    const std::string dir = cgroup_dir(paths_.root, *mounts.v2, *v2_path);
    if (auto cgroup = read_cgroup_hierarchy(dir, paths_.root + mounts.v2->mount_point, 2)) {
      return cgroup;
    }
  }
  if (v1_path && mounts.v1_memory) {
    const std::string dir = cgroup_dir(paths_.root, *mounts.v1_memory, *v1_path);
    return read_cgroup_hierarchy(dir, paths_.root + mounts.v1_memory->mount_point, 1);
  }
  return std::nullopt;
}

uint64_t MemoryMonitor::available_memory_bytes() const {
  uint64_t available = read_system().mem_available_bytes;
  if (const auto cgroup = read_cgroup(0); cgroup && cgroup->headroom_bytes) {
    available = std::min(available, *cgroup->headroom_bytes);
  }
  return available;
}

uint64_t MemoryMonitor::total_memory_bytes() const {
  uint64_t total = read_system().mem_total_bytes;
  if (const auto cgroup = read_cgroup(0); cgroup && cgroup->memory_max_bytes) {
    total = std::min(total, *cgroup->memory_max_bytes);
  }
  return total;
}

std::optional<uint64_t> process_gpu_bytes(const std::vector<GpuMemory>& gpus, int pid) {
  if (pid < 0) return 0;
  uint64_t total = 0;
  for (const GpuMemory& gpu : gpus) {
    const auto found = gpu.process_bytes.find(static_cast<uint32_t>(pid));
    if (found == gpu.process_bytes.end()) continue;
    if (!found->second) return std::nullopt;
    total += *found->second;
  }
  return total;
}

std::optional<std::vector<GpuMemory>> MemoryMonitor::read_gpus() const {
  return detail::query_nvml_gpus();
}

UnifiedMemoryDetection MemoryMonitor::detect_unified_memory() const {
  // NVML (slow to start) is only asked when the override and the device
  // tree do not decide.
  if (auto decided = detect_from_files(paths_.root)) return *decided;
  return detect_unified_memory(read_gpus());
}

UnifiedMemoryDetection MemoryMonitor::detect_unified_memory(
    const std::optional<std::vector<GpuMemory>>& gpus) const {
  if (auto decided = detect_from_files(paths_.root)) return *decided;
  if (gpus) {
    for (const GpuMemory& gpu : *gpus) {
      if (!gpu.memory_info_supported) {
        return {true, "GPU " + std::to_string(gpu.index) + " (" + gpu.name +
                          ") reports no separate memory (NVML: not supported)"};
      }
      for (const char* superchip : {"GH200", "GB200", "GB10"}) {
        if (gpu.name.find(superchip) != std::string::npos) {
          return {true, "GPU " + std::to_string(gpu.index) + " (" + gpu.name +
                            ") shares a coherent memory pool with the CPU"};
        }
      }
    }
  }
  return {false, "no unified-memory device found"};
}

uint64_t available_memory_bytes() { return MemoryMonitor().available_memory_bytes(); }

}  // namespace leanloader
