// One HDF5 dataset in one file, described and checked under the HDF5 lock at
// open, then read without the library where that was proven equal. Internal.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
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

#include "hdf5/hdf5_api.h"
#include "io/file_handle_cache.h"
#include "leanloader/core/dtype.h"
#include "leanloader/core/storage.h"
#include "leanloader/core/tensor.h"
#include "leanloader/hdf5/chunk_filters.h"

namespace leanloader::detail {

class ChunkCache;
struct Hdf5Dataset;

// HDF5 file and dataset identifiers of datasets read through the library,
// opened on demand and closed beyond a budget (each holds a descriptor).
// Used only under Hdf5Lock.
class LibraryHandles {
 public:
  explicit LibraryHandles(size_t budget) : budget_(budget) {}
  ~LibraryHandles();
  LibraryHandles(const LibraryHandles&) = delete;
  LibraryHandles& operator=(const LibraryHandles&) = delete;

  // The open dataset identifier of `owner`; throws FormatError with the
  // library's cause when the file no longer opens.
  hid_t dataset(const Hdf5Dataset& owner);
  void forget(const Hdf5Dataset* owner);
  // Closes every open file; the next dataset() opens its file again. Takes
  // the HDF5 lock.
  void close_all() noexcept;

 private:
  struct Open {
    const Hdf5Dataset* owner;
    hid_t file;
    hid_t dataset;
  };
  void close(const Open& open);
  size_t budget_;
  std::list<Open> open_;  // most recently used first
  pid_t owner_pid_ = ::getpid();
};

// The descriptors of one source: data files for the fast paths, library
// handles for the rest.
struct Hdf5Files {
  explicit Hdf5Files(size_t budget)
      : data(budget), library(std::clamp<size_t>(data.budget() / 8, 4, 32)) {}
  FileHandleCache data;
  LibraryHandles library;
};

struct Hdf5ChunkLocation {
  uint64_t address = 0;  // kHaddrUndef when the chunk was never written
  uint64_t size = 0;     // stored (filtered) bytes
  uint32_t filter_mask = 0;
};

enum class Hdf5ReadPath { kPread, kChunks, kMemory, kLibrary };

struct Hdf5Dataset {
  // Opens `dataset` in `path`, describes it and checks the fast path against
  // the library (takes the HDF5 lock).
  Hdf5Dataset(const std::string& path, const std::string& dataset,
              std::shared_ptr<Hdf5Files> files);
  ~Hdf5Dataset();
  Hdf5Dataset(const Hdf5Dataset&) = delete;
  Hdf5Dataset& operator=(const Hdf5Dataset&) = delete;

  // Reads row `row` (< rows) into `dst` (row_bytes). Thread-safe.
  void read_row(int64_t row, std::span<std::byte> dst, ChunkCache* cache) const;
  // What one read_row may hold besides `dst`, at most: the stored bytes of
  // a chunk that is not read straight into its destination (filtered), and
  // a decoded chunk of several rows.
  size_t raw_chunk_bytes() const;
  size_t decoded_chunk_bytes() const;
  // What reading a row of a chunked dataset through the HDF5 library (H5Dread)
  // leaves with the reading thread: the stored chunk and the filter
  // pipeline's output (deflate grows it by doubling, so up to twice the
  // decoded chunk), freed into that thread's malloc arena, which keeps
  // them; 0 for the other read paths. Measured, 2 threads, Fletcher-32 +
  // gzip: 16 MiB chunks +49 MiB, 8 MiB +41 MiB (of which ~10 MiB is the
  // library's own state for the open file, not counted).
  size_t library_chunk_bytes() const;
  std::string where(int64_t row) const;  // "'file' dataset 'name' row N"

  std::string path;  // the file the user named
  // `path` made absolute at open, and what it was then: the library path
  // opens the file again by it (a later chdir, a replaced file must not make
  // it read another file).
  std::string open_path;
  FileIdentity identity;
  std::string data_path;  // the file that holds the data (another one through an external link)
  std::string name;
  DType dtype = DType::kU8;
  size_t element_size = 1;  // of dtype
  // The whole dataset: the dataspace's dimensions (the first space_rank),
  // then those of an array element (PyTables' atoms with a shape), as h5py
  // reads it. Chunks hold whole array elements.
  Shape shape;
  Shape row_shape;  // shape[1:]
  size_t space_rank = 0;
  size_t cell_bytes = 0;  // one element of the dataspace: an array element whole
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

  std::shared_ptr<Hdf5Files> files;
  size_t data_key = 0;     // in files->data (fast paths)
  hid_t memory_type = -1;  // for H5Dread: the file's type as stored in memory here
  pid_t owner_pid = 0;

 private:
  void describe_locked(hid_t file, hid_t dset);
  void index_chunks_locked(hid_t dset, hid_t plist, const std::string& here);
  bool chunk_base_matches_locked(hid_t dset, uint64_t userblock, std::string& why);
  void check_fast_path_locked(hid_t dset);
  // H5Dread of (a box of) `row`; false on failure, with the library's
  // cause in *cause when given.
  bool library_read_locked(hid_t dset, int64_t row, size_t box_from_dim, std::span<std::byte> dst,
                           std::string* cause) const;
  void read_row_library(int64_t row, std::span<std::byte> dst) const;
  void read_row_chunks(int64_t row, std::span<std::byte> dst, ChunkCache* cache) const;
  std::shared_ptr<const HeapStorage> load_chunk(size_t chunk, int64_t row, ChunkCache* cache) const;
  void decode_into(size_t chunk, int64_t row, std::span<std::byte> dst) const;
  std::span<const std::byte> read_raw(const File& file, size_t chunk, int64_t row,
                                      std::vector<std::byte>& buffer) const;
  bool library_decodes_filters_ = true;  // every filter is registered with the library
};

// Decoded chunks shared by rows of the same chunk, least recently used first
// out, within a byte budget. Thread-safe; decoding happens outside its lock.
class ChunkCache {
 public:
  explicit ChunkCache(size_t budget) : budget_(budget) {}
  std::shared_ptr<const HeapStorage> find(const void* owner, size_t chunk);
  void insert(const void* owner, size_t chunk, std::shared_ptr<const HeapStorage> data);
  size_t bytes() const;
  size_t budget() const noexcept { return budget_; }
  // Drops every decoded chunk (their readers keep theirs alive).
  void clear();

 private:
  using Key = std::pair<const void*, size_t>;
  struct KeyHash {
    size_t operator()(const Key& key) const noexcept {
      return std::hash<const void*>()(key.first) ^ (key.second * 0x9E3779B97F4A7C15ull);
    }
  };
  struct Entry {
    Key key;
    std::shared_ptr<const HeapStorage> data;
  };
  size_t budget_;
  mutable std::mutex mutex_;
  std::list<Entry> order_;  // most recently used first
  std::unordered_map<Key, std::list<Entry>::iterator, KeyHash> entries_;
  size_t bytes_ = 0;
};

}  // namespace leanloader::detail
