#include "leanloader/workers/shared_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <tuple>

#include "io/file_io.h"
#include "io/proc_maps.h"
#include "leanloader/core/checked_size.h"
#include "leanloader/core/error.h"
#include "leanloader/workers/shared_arena.h"
#include "workers/shared_file.h"

namespace leanloader {

namespace {

// Live segments of this process by start address, for find().
struct Registry {
  std::mutex mutex;
  std::map<uintptr_t, std::pair<size_t, std::weak_ptr<SharedSegment>>> by_start;
  // (st_dev, st_ino) of the segments whose pages this process maps
  // privately (remember_mapped_privately), for mapped_privately_here(): kept
  // for the process's life, since such mappings outlive the segment (shmem
  // inode numbers only grow). Batch segments, made by the thousand, are not
  // kept.
  std::set<std::pair<uint64_t, uint64_t>> mapped_privately;
};

Registry& registry() {
  static Registry* instance = new Registry();  // never destroyed: segments may outlive statics
  return *instance;
}

std::string unique_name() {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t salt = std::random_device{}();
  const uint64_t n = counter.fetch_add(1);
  return "leanloader-" + std::to_string(::getpid()) + "-" + std::to_string(n) + "-" +
         std::to_string(salt % 1000000007u);
}

std::string mib(uint64_t bytes) {
  const uint64_t tenths = bytes * 10 / (uint64_t{1} << 20);
  return std::to_string(tenths / 10) + "." + std::to_string(tenths % 10) + " MiB";
}

}  // namespace

namespace detail {

[[noreturn]] void throw_no_space(const std::string& dir, size_t size) {
  if (dir.empty()) {
    throw Error("cannot reserve " + std::to_string(size) + " bytes (" + mib(size) +
                    ") of shared memory (memfd): out of memory; use fewer workers or smaller "
                    "batches, or raise the container's memory limit",
                ErrorKind::kIo, ENOMEM);
  }
  std::string message = "cannot reserve " + std::to_string(size) + " bytes (" + mib(size) +
                        ") of shared memory in '" + dir + "': no space left on device";
  struct statvfs st {};
  if (::statvfs(dir.c_str(), &st) == 0) {
    const uint64_t free_bytes = uint64_t{st.f_bavail} * st.f_frsize;
    const uint64_t total_bytes = uint64_t{st.f_blocks} * st.f_frsize;
    message += " (" + mib(free_bytes) + " free of " + mib(total_bytes) + ")";
  }
  message += "; enlarge it (mount -o remount,size=8G " + dir +
             "), use fewer workers or smaller batches, or leave LEANLOADER_SHM_DIR and shm_dir "
             "unset (anonymous shared memory, limited by RAM only)";
  throw Error(message, ErrorKind::kIo, ENOSPC);
}

}  // namespace detail

int shared_mapping_descriptor(const void* address, size_t bytes) {
  const auto start = reinterpret_cast<uintptr_t>(address);
  for (const detail::ProcessMapping& mapping : detail::read_process_mappings()) {
    if (mapping.start != start) continue;
    if (mapping.perms.size() != 4 || mapping.perms[3] != 's' || mapping.offset != 0 ||
        mapping.inode == 0) {
      return -1;
    }
    for (const detail::DirectoryEntry& entry : detail::list_directory("/proc/self/fd")) {
      struct stat st {};
      int fd = -1;
      try {
        fd = std::stoi(entry.name);
      } catch (const std::exception&) {
        continue;
      }
      if (::fstat(fd, &st) == 0 && st.st_ino == mapping.inode && st.st_dev == mapping.device &&
          static_cast<uint64_t>(st.st_size) >= bytes) {
        return fd;
      }
    }
    return -1;
  }
  return -1;
}

std::string default_shm_dir() {
  const char* env = std::getenv("LEANLOADER_SHM_DIR");
  if (env != nullptr && env[0] != '\0') return env;
  return "";
}

SharedFile::~SharedFile() {
  if (fd >= 0) ::close(fd);
}

SharedSegment::SharedSegment(std::byte* data, size_t size, std::shared_ptr<const SharedFile> file,
                             size_t file_offset, bool writable, bool copy_on_write)
    : Storage(data, size, StorageKind::kHeap),  // leanloader-owned memory (shmem)
      file_(std::move(file)),
      file_offset_(file_offset),
      writable_(writable || copy_on_write),
      copy_on_write_(copy_on_write) {}

void SharedSegment::register_segment(const std::shared_ptr<SharedSegment>& segment) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.by_start[reinterpret_cast<uintptr_t>(segment->data())] = {segment->size(), segment};
}

void SharedSegment::remember_mapped_privately(SharedSegment& segment) {
  segment.mapped_privately_ = true;
  struct stat st {};
  if (::fstat(segment.fd(), &st) != 0) return;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.mapped_privately.insert({static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)});
}

bool SharedSegment::mapped_privately_here(uint64_t device, uint64_t inode) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.mapped_privately.count({device, inode}) != 0;
}

SharedSegment::~SharedSegment() {
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    auto it = r.by_start.find(reinterpret_cast<uintptr_t>(data_));
    if (it != r.by_start.end() && it->second.second.expired()) r.by_start.erase(it);
  }
  if (data_ != nullptr) ::munmap(data_, size_);
  if (arena_ != nullptr) {
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    arena_->release(file_offset_, (size_ + page - 1) / page * page, forks_at_creation_,
                    mapped_privately_);
  }
}

namespace detail {

// A new file of shared memory that has no name anywhere, so that nothing can
// be left behind whatever ends the process (SIGKILL included): a memfd when
// `dir` is empty (charged to the memory cgroup like any page, limited by no
// tmpfs size: Docker's 64 MiB /dev/shm does not apply), else an O_TMPFILE
// inode on `dir`'s filesystem (its size limit applies). A filesystem without
// O_TMPFILE gets a unique name that is unlinked at once (`unlink_now`).
int create_unnamed_file(const std::string& dir, std::string& path, bool& unlink_now) {
  unlink_now = false;
  if (dir.empty()) {
    path = "memfd:" + unique_name();
    const int fd = ::memfd_create(path.c_str() + 6, MFD_CLOEXEC);
    if (fd < 0) throw IoError("cannot create shared memory (memfd_create)", path, errno);
    return fd;
  }
  path = dir + "/" + unique_name();
  int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd >= 0) return fd;
  // EOPNOTSUPP: the filesystem has no O_TMPFILE; EISDIR: the kernel does
  // not know the flag. Any other error is the directory's own.
  if (errno != EOPNOTSUPP && errno != EISDIR) {
    throw IoError("cannot create shared memory segment", path, errno);
  }
  fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) throw IoError("cannot create shared memory segment", path, errno);
  unlink_now = true;
  return fd;
}

std::shared_ptr<const SharedFile> create_shared_file(const std::string& dir, size_t size,
                                                     SharedSegment::Reserve reserve) {
  std::string path;
  bool named = false;
  const int fd = create_unnamed_file(dir, path, named);
  // Unnamed from here on, whichever way the file was made.
  if (named) ::unlink(path.c_str());
  auto file = std::make_shared<const SharedFile>(fd, path);
  if (size == 0) return file;
  const int reserve_error = reserve == SharedSegment::Reserve::kNow
                                ? ::posix_fallocate(fd, 0, static_cast<off_t>(size))
                                : (::ftruncate(fd, static_cast<off_t>(size)) == 0 ? 0 : errno);
  if (reserve_error != 0) {
    if (reserve_error == ENOSPC || reserve_error == ENOMEM) throw_no_space(dir, size);
    throw IoError("cannot reserve " + std::to_string(size) + " bytes for", path, reserve_error);
  }
  return file;
}

std::string directory_of(const SharedFile& file) {
  if (file.path.rfind("memfd:", 0) == 0) return std::string();
  const size_t slash = file.path.rfind('/');
  return slash == std::string::npos ? std::string(".") : file.path.substr(0, slash);
}

void reserve_range(const SharedFile& file, size_t offset, size_t bytes) {
  if (bytes == 0) return;
  const int error_number =
      ::posix_fallocate(file.fd, static_cast<off_t>(offset), static_cast<off_t>(bytes));
  if (error_number == 0) return;
  if (error_number == ENOSPC || error_number == ENOMEM) {
    throw_no_space(directory_of(file), bytes);
  }
  throw IoError("cannot reserve " + std::to_string(bytes) + " bytes for", file.path, error_number);
}

}  // namespace detail

std::shared_ptr<SharedSegment> SharedSegment::create(size_t size, const std::string& dir_arg,
                                                     Reserve reserve) {
  if (size == 0) throw InvalidArgument("a shared memory segment needs a size above 0");
  const std::string dir = dir_arg.empty() ? default_shm_dir() : dir_arg;
  auto file = detail::create_shared_file(dir, size, reserve);
  void* data = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, file->fd, 0);
  if (data == MAP_FAILED) throw IoError("cannot map shared memory segment", file->path, errno);
  auto segment = std::shared_ptr<SharedSegment>(
      new SharedSegment(static_cast<std::byte*>(data), size, std::move(file), 0, true, false));
  segment->made_here_ = true;
  register_segment(segment);
  return segment;
}

std::shared_ptr<SharedSegment> SharedSegment::over_range(std::byte* data, size_t size,
                                                         std::shared_ptr<const SharedFile> file,
                                                         size_t file_offset,
                                                         std::shared_ptr<SharedArena> arena) {
  auto segment = std::shared_ptr<SharedSegment>(
      new SharedSegment(data, size, std::move(file), file_offset, true, false));
  segment->arena_ = std::move(arena);
  segment->made_here_ = true;
  segment->forks_at_creation_ = forks_of_this_process();
  register_segment(segment);
  return segment;
}

namespace {

// The descriptors of files attached in this process, so that segments
// attached from one file (an arena's ranges) share one: by (st_dev, st_ino,
// opened for writing).
struct AttachedFiles {
  std::mutex mutex;
  std::map<std::tuple<uint64_t, uint64_t, bool>, std::weak_ptr<const SharedFile>> by_inode;
};

AttachedFiles& attached_files() {
  static auto* instance = new AttachedFiles();  // never destroyed: segments may outlive statics
  return *instance;
}

}  // namespace

std::shared_ptr<SharedSegment> SharedSegment::attach(const std::string& path, bool writable,
                                                     bool copy_on_write, size_t file_offset,
                                                     size_t size) {
  const bool shared_write = writable && !copy_on_write;
  const int fd = ::open(path.c_str(), (shared_write ? O_RDWR : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) throw IoError("cannot open shared memory segment", path, errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int error_number = errno;
    ::close(fd);
    throw IoError("cannot stat shared memory segment", path, error_number);
  }
  std::shared_ptr<const SharedFile> file;
  {
    AttachedFiles& files = attached_files();
    std::lock_guard<std::mutex> lock(files.mutex);
    auto& known = files.by_inode[{static_cast<uint64_t>(st.st_dev),
                                  static_cast<uint64_t>(st.st_ino), shared_write}];
    file = known.lock();
    if (file == nullptr) {
      file = std::make_shared<const SharedFile>(fd, path);
      known = file;
    } else {
      ::close(fd);
    }
  }
  const auto file_bytes = static_cast<size_t>(st.st_size);
  if (size == 0) {
    if (file_offset >= file_bytes) {
      throw InvalidArgument("shared memory segment '" + path + "' is empty");
    }
    size = file_bytes - file_offset;
  }
  const auto end = checked_add(file_offset, size);
  if (!end || *end > file_bytes || file_offset % static_cast<size_t>(::sysconf(_SC_PAGESIZE))) {
    throw InvalidArgument("shared memory segment '" + path + "' of " + std::to_string(file_bytes) +
                          " bytes has no page-aligned range of " + std::to_string(size) +
                          " bytes at offset " + std::to_string(file_offset));
  }
  const int protection = PROT_READ | (writable || copy_on_write ? PROT_WRITE : 0);
  void* data = ::mmap(nullptr, size, protection, copy_on_write ? MAP_PRIVATE : MAP_SHARED, file->fd,
                      static_cast<off_t>(file_offset));
  if (data == MAP_FAILED) throw IoError("cannot map shared memory segment", path, errno);
  auto segment = std::shared_ptr<SharedSegment>(new SharedSegment(
      static_cast<std::byte*>(data), size, std::move(file), file_offset, writable, copy_on_write));
  register_segment(segment);
  return segment;
}

std::string SharedSegment::attach_path() const {
  return "/proc/" + std::to_string(::getpid()) + "/fd/" + std::to_string(fd());
}

void SharedSegment::check_range(size_t offset, size_t bytes, const char* what) const {
  if (offset > size_ || bytes > size_ - offset) {
    throw InvalidArgument(std::string(what) + " of " + std::to_string(bytes) + " bytes at offset " +
                          std::to_string(offset) + " does not fit a shared memory segment of " +
                          std::to_string(size_) + " bytes");
  }
}

void SharedSegment::reserve(size_t offset, size_t bytes) {
  check_range(offset, bytes, "reservation");
  detail::reserve_range(*file_, file_offset_ + offset, bytes);
}

void SharedSegment::write(size_t offset, const void* src, size_t bytes) {
  if (!writable_) throw InvalidArgument("shared memory segment '" + path() + "' is read-only");
  check_range(offset, bytes, "write");
  if (!made_here_) {
    if (bytes > 0) std::memcpy(data_ + offset, src, bytes);
    return;
  }
  const auto* from = static_cast<const std::byte*>(src);
  while (bytes > 0) {
    const ssize_t written =
        ::pwrite(file_->fd, from, bytes, static_cast<off_t>(file_offset_ + offset));
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) {
      const int error_number = written < 0 ? errno : ENOSPC;
      if (error_number == ENOSPC || error_number == ENOMEM) {
        detail::throw_no_space(detail::directory_of(*file_), bytes);
      }
      throw IoError("cannot write " + std::to_string(bytes) + " bytes into shared memory segment",
                    path(), error_number);
    }
    from += written;
    offset += static_cast<size_t>(written);
    bytes -= static_cast<size_t>(written);
  }
}

std::shared_ptr<SharedSegment> SharedSegment::find(const void* address) {
  const auto a = reinterpret_cast<uintptr_t>(address);
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.by_start.upper_bound(a);
  if (it == r.by_start.begin()) return nullptr;
  --it;
  if (a >= it->first + it->second.first) return nullptr;
  return it->second.second.lock();
}

}  // namespace leanloader
