#include "leanloader/core/storage.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <new>

#include "leanloader/core/error.h"

namespace leanloader {

namespace {

// Below this size malloc's arenas are fine; above it a private mapping avoids
// fragmenting the heap with batch-sized blocks.
constexpr size_t kMmapThreshold = size_t{1} << 20;
// Blocks of this size and above are offered transparent huge pages.
constexpr size_t kHugePageThreshold = size_t{4} << 20;

}  // namespace

std::shared_ptr<HeapStorage> HeapStorage::allocate(size_t size) {
  const size_t bytes = size == 0 ? kBufferAlignment : size;
  if (bytes >= kMmapThreshold) {
    void* data = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (data == MAP_FAILED) {
      throw OutOfMemory("cannot map " + std::to_string(bytes) + " bytes of anonymous memory");
    }
    if (bytes >= kHugePageThreshold) {
      // Batch slots are written whole: 2 MiB pages make their first touch one
      // fault per 2 MiB instead of per 4 KiB (advice only; the kernel falls
      // back to small pages when it has no huge ones, or THP is off).
      ::madvise(data, bytes, MADV_HUGEPAGE);
    }
    return std::shared_ptr<HeapStorage>(new HeapStorage(static_cast<std::byte*>(data), size, true));
  }
  void* data = std::aligned_alloc(
      kBufferAlignment, (bytes + kBufferAlignment - 1) / kBufferAlignment * kBufferAlignment);
  if (data == nullptr) {
    throw OutOfMemory("cannot allocate " + std::to_string(bytes) + " bytes");
  }
  return std::shared_ptr<HeapStorage>(new HeapStorage(static_cast<std::byte*>(data), size, false));
}

HeapStorage::HeapStorage(std::byte* data, size_t size, bool mapped)
    : Storage(data, size, StorageKind::kHeap), mapped_(mapped) {}

HeapStorage::~HeapStorage() {
  if (mapped_) {
    ::munmap(data_, size_ == 0 ? kBufferAlignment : size_);
  } else {
    std::free(data_);
  }
}

std::shared_ptr<MappedFile> MappedFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw IoError("cannot open", path, errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int error_number = errno;
    ::close(fd);
    throw IoError("cannot stat", path, error_number);
  }
  const auto size = static_cast<size_t>(st.st_size);
  void* data = nullptr;
  if (size > 0) {
    // MAP_PRIVATE + PROT_WRITE: pages stay shared page cache until a user
    // writes into a tensor in place; the write then lands in a private copy
    // and never reaches the file (as the reference safetensors reader does).
    data = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    if (data == MAP_FAILED) {
      const int error_number = errno;
      ::close(fd);
      throw IoError("cannot map", path, error_number);
    }
  }
  // The mapping holds its own reference to the file; the descriptor is not
  // needed after mmap, which keeps open-file counts bounded by nothing.
  ::close(fd);
  return std::shared_ptr<MappedFile>(new MappedFile(static_cast<std::byte*>(data), size, path));
}

MappedFile::MappedFile(std::byte* data, size_t size, std::string path)
    : Storage(data, size, StorageKind::kMapped), path_(std::move(path)) {}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(data_, size_);
}

}  // namespace leanloader
