// One HDF5 dataset in one file, opened and described under the HDF5 mutex,
// then read without the library where it can be. Internal.
#pragma once

#include <hdf5.h>

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "io/file_io.h"
#include "leanloader/core/dtype.h"
#include "leanloader/core/tensor.h"
#include "leanloader/hdf5/chunk_filters.h"

namespace leanloader::detail {

// Every call into the HDF5 library holds this mutex: Debian's libhdf5 is not
// built thread-safe, and a thread-safe build would serialise anyway.
std::mutex& hdf5_mutex();

class ChunkCache;

struct Hdf5ChunkLocation {
  uint64_t address = 0;  // HADDR_UNDEF when the chunk was never written
  uint64_t size = 0;     // stored (filtered) bytes
  uint32_t filter_mask = 0;
};

enum class Hdf5ReadPath { kPread, kChunks, kMemory, kLibrary };

struct Hdf5Dataset {
  // Opens `dataset` in `path` (takes the HDF5 mutex).
  Hdf5Dataset(const std::string& path, const std::string& dataset);
  ~Hdf5Dataset();
  Hdf5Dataset(const Hdf5Dataset&) = delete;
  Hdf5Dataset& operator=(const Hdf5Dataset&) = delete;

  // Reads row `row` (< rows) into `dst` (row_bytes). Thread-safe.
  void read_row(int64_t row, std::span<std::byte> dst, ChunkCache* cache) const;
  std::string where(int64_t row) const;  // "'file' dataset 'name' row N"

  std::string path;
  std::string name;
  DType dtype = DType::kU8;
  size_t element_size = 1;
  Shape shape;      // the whole dataset
  Shape row_shape;  // shape[1:]
  int64_t rows = 0;
  size_t row_bytes = 0;
  Hdf5ReadPath read_path = Hdf5ReadPath::kLibrary;
  std::string library_reason;  // why kLibrary

  // kPread
  uint64_t offset = 0;
  // kChunks
  Shape chunk_shape;
  Shape chunk_grid;  // chunks per dimension
  size_t chunk_bytes = 0;
  std::vector<Hdf5ChunkLocation> chunks;  // the grid in C order
  std::vector<Hdf5Filter> filters;
  bool chunk_is_row = false;  // one chunk holds exactly one whole row
  // kMemory
  std::vector<std::byte> data;

  std::unique_ptr<File> reader;
  hid_t file_id = -1;
  hid_t dataset_id = -1;
  hid_t memory_type = -1;  // for H5Dread: the file type, little-endian
  pid_t owner_pid = 0;

 private:
  void index_chunks_locked(hid_t dset, hid_t plist, const std::string& here);
  void read_row_library(int64_t row, std::span<std::byte> dst) const;
  void read_row_chunks(int64_t row, std::span<std::byte> dst, ChunkCache* cache) const;
  std::shared_ptr<const std::vector<std::byte>> load_chunk(size_t chunk, int64_t row,
                                                           ChunkCache* cache) const;
  void decode_into(size_t chunk, int64_t row, std::span<std::byte> dst) const;
  std::span<const std::byte> read_raw(size_t chunk, int64_t row,
                                      std::vector<std::byte>& buffer) const;
};

// Decoded chunks shared by rows of the same chunk, least recently used first
// out, within a byte budget. Thread-safe; decoding happens outside its lock.
class ChunkCache {
 public:
  explicit ChunkCache(size_t budget) : budget_(budget) {}
  std::shared_ptr<const std::vector<std::byte>> find(const void* owner, size_t chunk);
  void insert(const void* owner, size_t chunk, std::shared_ptr<const std::vector<std::byte>> data);
  size_t bytes() const;
  size_t budget() const noexcept { return budget_; }

 private:
  using Key = std::pair<const void*, size_t>;
  struct KeyHash {
    size_t operator()(const Key& key) const noexcept {
      return std::hash<const void*>()(key.first) ^ (key.second * 0x9E3779B97F4A7C15ull);
    }
  };
  struct Entry {
    Key key;
    std::shared_ptr<const std::vector<std::byte>> data;
  };
  size_t budget_;
  mutable std::mutex mutex_;
  std::list<Entry> order_;  // most recently used first
  std::unordered_map<Key, std::list<Entry>::iterator, KeyHash> entries_;
  size_t bytes_ = 0;
};

}  // namespace leanloader::detail
