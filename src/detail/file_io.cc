#include "detail/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "leanloader/error.h"

namespace leanloader::detail {

File::File(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw IoError("cannot open", path, errno);
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    const int error_number = errno;
    ::close(fd_);
    throw IoError("cannot stat", path, error_number);
  }
  size_ = static_cast<size_t>(st.st_size);
}

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

std::vector<std::byte> File::read_prefix(size_t max_bytes) const {
  std::vector<std::byte> bytes(std::min(max_bytes, size_));
  read_exact(0, bytes);
  return bytes;
}

std::vector<std::byte> read_file_prefix(const std::string& path, size_t max_bytes) {
  return File(path).read_prefix(max_bytes);
}

}  // namespace leanloader::detail
