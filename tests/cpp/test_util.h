// Helpers shared by the C++ tests: temporary directories and .npy writing.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "leanloader/core/dtype.h"
#include "leanloader/core/tensor.h"
#include "leanloader/sources/array_source.h"

namespace leanloader::testing {

// An ArraySource of `size` samples: field "id" (int64, = index) and field
// "x" (4 floats, = index * 10 + column).
inline std::shared_ptr<ArraySource> id_source(int64_t size) {
  auto ids = HeapStorage::allocate(static_cast<size_t>(size) * 8);
  auto xs = HeapStorage::allocate(static_cast<size_t>(size) * 16);
  for (int64_t i = 0; i < size; ++i) {
    reinterpret_cast<int64_t*>(ids->data())[i] = i;
    for (int c = 0; c < 4; ++c) reinterpret_cast<float*>(xs->data())[i * 4 + c] = float(i * 10 + c);
  }
  return std::make_shared<ArraySource>(std::vector<ArraySource::Field>{
      {"id", Tensor(ids, 0, DType::kI64, {size})}, {"x", Tensor(xs, 0, DType::kF32, {size, 4})}});
}

// A fresh directory removed (recursively) when the object dies.
class TempDir {
 public:
  TempDir() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "leanloader-test-XXXXXX").string();
    path_ = ::mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline std::string npy_descr(DType dtype) {
  switch (dtype) {
    case DType::kU8:
      return "|u1";
    case DType::kI64:
      return "<i8";
    case DType::kF32:
      return "<f4";
    case DType::kF64:
      return "<f8";
    default:
      return "<i4";
  }
}

// Writes a version-1.0 .npy file as NumPy does (header padded to 64 bytes).
inline void write_npy(const std::string& path, DType dtype, const Shape& shape, const void* data,
                      size_t bytes, bool fortran_order = false) {
  std::string dims;
  for (const int64_t dim : shape) dims += std::to_string(dim) + ", ";
  if (shape.size() > 1) dims.resize(dims.size() - 2);
  std::string header = "{'descr': '" + npy_descr(dtype) +
                       "', 'fortran_order': " + (fortran_order ? "True" : "False") +
                       ", 'shape': (" + dims + "), }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::ofstream out(path, std::ios::binary);
  out.write("\x93NUMPY\x01\x00", 8);
  const uint16_t length = static_cast<uint16_t>(header.size());
  out.write(reinterpret_cast<const char*>(&length), 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
}

template <typename T>
void write_npy(const std::string& path, DType dtype, const Shape& shape,
               const std::vector<T>& values) {
  write_npy(path, dtype, shape, values.data(), values.size() * sizeof(T));
}

inline constexpr size_t kMiB = size_t{1} << 20;

// The page size of this machine.
inline const size_t kPage = static_cast<size_t>(::sysconf(_SC_PAGESIZE));

// How many pages of `path`'s bytes [offset, offset + length) are in the page
// cache (`offset` a multiple of the page size; the range ends at the file's end).
inline size_t resident_pages(const std::string& path, size_t offset = 0,
                             size_t length = static_cast<size_t>(-1)) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw std::runtime_error("cannot open " + path);
  const auto size = static_cast<size_t>(std::filesystem::file_size(path));
  size_t count = 0;
  if (offset < size) {
    length = std::min(length, size - offset);
    void* map = ::mmap(nullptr, length, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(offset));
    std::vector<unsigned char> resident((length + kPage - 1) / kPage, 1);
    if (map != MAP_FAILED) {
      if (::mincore(map, length, resident.data()) != 0) resident.assign(resident.size(), 1);
      ::munmap(map, length);
    }
    count = static_cast<size_t>(
        std::count_if(resident.begin(), resident.end(), [](unsigned char r) { return r & 1; }));
  }
  ::close(fd);
  return count;
}

// Writes a file of `bytes` bytes of 'x' at `path`; returns the path.
inline std::string write_filled_file(const std::string& path, size_t bytes) {
  const std::vector<char> data(bytes, 'x');
  std::ofstream(path, std::ios::binary).write(data.data(), static_cast<std::streamsize>(bytes));
  return path;
}

// Asks the kernel to drop `path`'s pages from the page cache; returns how
// many pages stayed resident (tmpfs keeps them all; pages mapped by someone
// may stay).
inline size_t evict_from_page_cache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw std::runtime_error("cannot open " + path);
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  return resident_pages(path);
}

// What became of reads made right after evicting a file.
enum class EvictedRead { kCounted, kNeverCounted, kCannotEvict };

// Evicts (`evict` returns the pages still resident: more than
// `most_resident` means the file system keeps the file in memory), then
// reads (`read_counted(attempt)`: whether that read was counted as waiting
// for storage), until one read counts, at most `attempts` times. A read
// right after an eviction can still find its bytes cached: pages the kernel
// is reading ahead are neither dropped nor counted as resident until their
// I/O ends, and a read with RWF_NOWAIT starts read-ahead itself, which a
// fast virtual disk can finish before the call looks again (an 8 MiB
// read-ahead disk: 3-11 of 100 such reads served whole; 5 attempts ran out
// in 2 of 30 runs under ThreadSanitizer beside a busy process).
inline EvictedRead read_after_eviction_until_counted(const std::function<size_t()>& evict,
                                                     size_t most_resident,
                                                     const std::function<bool(int)>& read_counted,
                                                     int attempts = 40) {
  for (int attempt = 0; attempt < attempts; ++attempt) {
    if (evict() > most_resident) return EvictedRead::kCannotEvict;
    if (read_counted(attempt)) return EvictedRead::kCounted;
  }
  return EvictedRead::kNeverCounted;
}

}  // namespace leanloader::testing
