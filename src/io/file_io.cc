#include "io/file_io.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <random>

#include "leanloader/core/error.h"

namespace leanloader::detail {

File::File(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) {
    const int error_number = errno;
    if (error_number == EMFILE || error_number == ENFILE) {
      rlimit limit{};
      ::getrlimit(RLIMIT_NOFILE, &limit);
      throw IoError("too many open files in this process (ulimit -n is " +
                        std::to_string(limit.rlim_cur) +
                        "; raise it, or hold fewer files open) "
                        "while opening",
                    path, error_number);
    }
    throw IoError("cannot open", path, error_number);
  }
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    const int error_number = errno;
    ::close(fd_);
    throw IoError("cannot stat", path, error_number);
  }
  size_ = static_cast<size_t>(st.st_size);
}

size_t File::current_size() const {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) throw IoError("cannot stat", path_, errno);
  return static_cast<size_t>(st.st_size);
}

bool file_still_reaches(const File& file, size_t end) { return file.current_size() >= end; }

File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

void File::read_exact(size_t offset, std::span<std::byte> dst) const {
  size_t done = 0;
  while (done < dst.size()) {
    const ssize_t n =
        ::pread(fd_, dst.data() + done, dst.size() - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw IoError("cannot read", path_, errno);
    }
    if (n == 0) {
      throw FormatError("'" + path_ + "': file ended at byte " + std::to_string(offset + done) +
                        ", expected " + std::to_string(dst.size()) + " bytes from offset " +
                        std::to_string(offset) + " (was it truncated?)");
    }
    done += static_cast<size_t>(n);
  }
}

bool File::read_exact_noting_misses(size_t offset, std::span<std::byte> dst) const {
  size_t done = 0;
  while (done < dst.size()) {
    iovec io{dst.data() + done, dst.size() - done};
    const ssize_t n = ::preadv2(fd_, &io, 1, static_cast<off_t>(offset + done), RWF_NOWAIT);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    const int error = n < 0 ? errno : 0;
    if (error == EINTR) continue;
    // EAGAIN (not cached), EOF or an error (EOPNOTSUPP on file systems
    // without RWF_NOWAIT): read_exact reads the rest or reports it.
    read_exact(offset + done, dst.subspan(done));
    return error == EOPNOTSUPP;  // no way to tell: not counted as a miss
  }
  return true;
}

void File::will_need(size_t offset, size_t length) const noexcept {
  ::posix_fadvise(fd_, static_cast<off_t>(offset), static_cast<off_t>(length), POSIX_FADV_WILLNEED);
}

std::vector<std::byte> File::read_prefix(size_t max_bytes) const {
  std::vector<std::byte> bytes(std::min(max_bytes, size_));
  read_exact(0, bytes);
  return bytes;
}

std::vector<std::byte> read_file_prefix(const std::string& path, size_t max_bytes) {
  return File(path).read_prefix(max_bytes);
}

std::string read_whole_file(const std::string& path) {
  const File file(path);
  std::string text(file.size(), '\0');
  file.read_exact(0, {reinterpret_cast<std::byte*>(text.data()), text.size()});
  return text;
}

std::string parent_directory(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

void fsync_directory(const std::string& directory) {
  const int fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw IoError("cannot open directory", directory, errno);
  const int result = ::fsync(fd);
  const int error_number = errno;
  ::close(fd);
  if (result != 0) throw IoError("cannot fsync directory", directory, error_number);
}

namespace {

// stat(2) of `path` as an identity; nullopt (errno set) when it fails.
std::optional<FileIdentity> stat_identity(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  return FileIdentity::of(st);
}

}  // namespace

FileIdentity FileIdentity::of(const struct stat& st) {
  return {st.st_dev, st.st_ino, static_cast<int64_t>(st.st_size),
          int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec};
}

FileIdentity FileIdentity::of(const std::string& path) {
  const std::optional<FileIdentity> identity = stat_identity(path);
  if (!identity) throw IoError("cannot stat", path, errno);
  return *identity;
}

bool FileIdentity::unchanged(const std::string& path) const {
  const std::optional<FileIdentity> now = stat_identity(path);
  return now && *now == *this;
}

void FileIdentity::check_unchanged(const std::string& path) const {
  const FileIdentity now = of(path);
  if (now == *this) return;
  std::string what;
  if (now.device != device || now.inode != inode) {
    what = "another file now";
  } else {
    char later[32];
    std::snprintf(later, sizeof later, "%.3f",
                  static_cast<double>(now.modified_ns - modified_ns) / 1e9);
    what = "written: size " + std::to_string(size) + " then, " + std::to_string(now.size) +
           " now, modified " + later + " s later";
  }
  throw FormatError("'" + path + "' was replaced or modified since the source opened it (" + what +
                    "); open the source again to read it as it is now");
}

std::string absolute_path(const std::string& path) {
  char resolved[PATH_MAX];
  if (::realpath(path.c_str(), resolved) != nullptr) return resolved;
  return path;
}

std::string absolute_path_as_named(const std::string& path) {
  std::error_code error;
  const std::filesystem::path absolute = std::filesystem::absolute(path, error);
  if (error || path.empty()) return path;
  std::filesystem::path kept;
  for (const std::filesystem::path& part : absolute) {
    if (!part.empty() && part != ".") kept /= part;
  }
  return kept.string();
}

namespace {

constexpr size_t kWriteBufferBytes = size_t{1} << 20;
constexpr char kTemporaryMarker[] = ".tmp.";

std::string unique_temporary_path(const std::string& path) {
  static thread_local std::mt19937_64 generator = [] {
    std::random_device device;
    const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
    return std::mt19937_64((static_cast<uint64_t>(device()) << 32) ^ static_cast<uint64_t>(now) ^
                           static_cast<uint64_t>(::getpid()));
  }();
  static constexpr char kHex[] = "0123456789abcdef";
  uint64_t bits = generator();
  std::string suffix;
  for (int i = 0; i < 12; ++i, bits >>= 4) suffix.push_back(kHex[bits & 0xF]);
  return path + kTemporaryMarker + std::to_string(::getpid()) + "." + suffix;
}

}  // namespace

AtomicFileWriter::AtomicFileWriter(std::string path)
    : path_(std::move(path)), temp_(unique_temporary_path(path_)) {
  fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd_ < 0) throw IoError("cannot create", temp_, errno);
  // A file replaced keeps its permission bits (a group-only file must not
  // become readable by everyone through the umask's default).
  struct stat existing {};
  if (::stat(path_.c_str(), &existing) == 0 && S_ISREG(existing.st_mode) &&
      ::fchmod(fd_, existing.st_mode & 07777) != 0) {
    const int error = errno;
    discard();
    throw IoError("cannot give the permissions of the file it replaces to", temp_, error);
  }
  buffer_.reserve(kWriteBufferBytes);
}

AtomicFileWriter::~AtomicFileWriter() { discard(); }

void AtomicFileWriter::discard() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!temp_.empty()) ::unlink(temp_.c_str());
  temp_.clear();
}

void AtomicFileWriter::write(const std::byte* data, size_t size) {
  if (size >= kWriteBufferBytes / 4) {
    flush();
    write_through(data, size);
    return;
  }
  if (buffer_.size() + size > kWriteBufferBytes) flush();
  buffer_.insert(buffer_.end(), data, data + size);
}

void AtomicFileWriter::flush() {
  write_through(buffer_.data(), buffer_.size());
  buffer_.clear();
}

void AtomicFileWriter::write_through(const std::byte* data, size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd_, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw IoError("cannot write", temp_, errno);
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
}

void AtomicFileWriter::commit() {
  flush();
  if (::fsync(fd_) != 0) throw IoError("cannot fsync", temp_, errno);
  const int fd = fd_;
  fd_ = -1;  // closed below whatever happens; never closed twice
  if (::close(fd) != 0) throw IoError("cannot close", temp_, errno);
  if (::rename(temp_.c_str(), path_.c_str()) != 0) {
    throw IoError("cannot rename '" + temp_ + "' to", path_, errno);
  }
  temp_.clear();  // it is the file now
  // The rename is durable only once the directory entry is on disk.
  fsync_directory(parent_directory(path_));
}

std::vector<DirectoryEntry> list_directory(const std::string& directory) {
  DIR* dir = ::opendir(directory.c_str());
  if (dir == nullptr) throw IoError("cannot open directory", directory, errno);
  std::vector<DirectoryEntry> entries;
  int read_error = 0;
  while (true) {
    errno = 0;
    const dirent* entry = ::readdir(dir);
    if (entry == nullptr) {
      read_error = errno;  // 0 at the end of the directory
      break;
    }
    const std::string_view name = entry->d_name;
    if (name == "." || name == "..") continue;
    try {
      entries.push_back({std::string(name), entry->d_type});
    } catch (...) {
      ::closedir(dir);
      throw;
    }
  }
  ::closedir(dir);
  if (read_error != 0) throw IoError("cannot read directory", directory, read_error);
  return entries;
}

}  // namespace leanloader::detail
