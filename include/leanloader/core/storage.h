// Storage: a block of bytes with one owner, viewed by Tensors.
//
// Ownership: Storages are held by std::shared_ptr; a Tensor (and every DLPack
// capsule exported from it) keeps its Storage alive. Destruction releases the
// bytes the way they were obtained (free, munmap, return to a BatchPool, or a
// foreign release callback). Thread-safety: the bytes are plain memory; a
// Storage object itself is immutable after construction.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "leanloader/core/device_location.h"

namespace leanloader {

enum class StorageKind {
  kHeap,      // anonymous memory owned by leanloader
  kMapped,    // a read-only mapping of a file (page cache, reclaimable)
  kPoolSlot,  // a BatchPool slot, returned to the pool on release
  kExternal,  // memory owned by someone else (a NumPy array), kept alive by a callback
  kDevice,    // a block of accelerator memory (device/device_feed.h)
};

class Storage {
 public:
  virtual ~Storage() = default;
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  std::byte* data() const noexcept { return data_; }
  size_t size() const noexcept { return size_; }
  StorageKind kind() const noexcept { return kind_; }
  // Where the bytes are: host memory unless a device Storage says otherwise
  // (data() is then a device address, not to be dereferenced on the host).
  virtual DeviceLocation device() const noexcept { return {}; }

 protected:
  Storage(std::byte* data, size_t size, StorageKind kind) : data_(data), size_(size), kind_(kind) {}
  std::byte* data_;
  size_t size_;
  StorageKind kind_;
};

// Alignment of every buffer leanloader allocates: a cache line, which is also
// enough for any dtype and for vector loads.
inline constexpr size_t kBufferAlignment = 64;

// Anonymous memory. Large blocks come from mmap so that they are page-aligned
// and go back to the OS when freed (no allocator fragmentation across epochs);
// blocks of 4 MiB and more are advised to use transparent huge pages.
class HeapStorage final : public Storage {
 public:
  static std::shared_ptr<HeapStorage> allocate(size_t size);
  ~HeapStorage() override;

 private:
  HeapStorage(std::byte* data, size_t size, bool mapped);
  bool mapped_;
};

// A copy-on-write mapping of a whole file. Pages are file-backed: they live
// in the page cache, are shared by every reader in every process, and are
// reclaimable. A write through a view touches a private copy of that page
// only; the file never changes.
class MappedFile final : public Storage {
 public:
  // Throws IoError (kNotFound for a missing file).
  static std::shared_ptr<MappedFile> open(const std::string& path);
  ~MappedFile() override;
  const std::string& path() const noexcept { return path_; }

 private:
  MappedFile(std::byte* data, size_t size, std::string path);
  std::string path_;
};

// Memory owned elsewhere. `release` runs once when the last view goes away;
// it must be safe to call from any thread.
class ExternalStorage final : public Storage {
 public:
  ExternalStorage(std::byte* data, size_t size, std::function<void()> release)
      : Storage(data, size, StorageKind::kExternal), release_(std::move(release)) {}
  ~ExternalStorage() override {
    if (release_) release_();
  }

 private:
  std::function<void()> release_;
};

}  // namespace leanloader
