// Positional file reads with errors that name the file. Internal.
//
// pread only: no shared file offsets, so any thread (or forked process) may
// read any range of a File concurrently.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <vector>

namespace leanloader::detail {

class File {
 public:
  // Opens read-only; throws IoError (kNotFound for a missing path).
  explicit File(const std::string& path);
  ~File();
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  size_t size() const noexcept { return size_; }
  const std::string& path() const noexcept { return path_; }

  // Reads exactly dst.size() bytes at `offset`; throws FormatError when the
  // file ends first (it was truncated) and IoError on a failed read.
  void read_exact(size_t offset, std::span<std::byte> dst) const;
  // Reads up to `max_bytes` from the start of the file.
  std::vector<std::byte> read_prefix(size_t max_bytes) const;

 private:
  std::string path_;
  int fd_ = -1;
  size_t size_ = 0;
};

std::vector<std::byte> read_file_prefix(const std::string& path, size_t max_bytes);

}  // namespace leanloader::detail
