// HDF5Source: samples from datasets in HDF5 files, read in parallel past the
// HDF5 library's global lock.
//
// Each field is one dataset; row i along its first axis is sample i. A field
// may span many files (a glob, matches concatenated in sorted order) and may
// be indexed through an index array: row i of the field is then
// rows[index[i]] (seed 004: the stimulus image of trial i is
// images[trial_to_image[i]]). Every field must end up with the same number of
// rows.
//
// How rows are read. Each file is opened and described once, under the HDF5
// lock (hdf5_library.h: the HDF5 h5py uses when it is loaded, else the
// system's): dtype, shape, layout, the file that holds the data (through
// external links), the file address of contiguous data and the address,
// size and filter mask of every chunk. The fast path then proves itself: a
// chunk read with pread must equal H5Dread_chunk's (which also settles
// whether addresses include a user block), and the first and last row must
// equal H5Dread's; on any difference the file is read through the library.
// Reads then bypass the library:
// - contiguous, unfiltered data: pread at the dataset's offset, straight into
//   the batch row;
// - chunked data: the raw chunks are pread and their filters (shuffle,
//   deflate, lz4, zstd, blosc, lzf) reversed in the worker thread
//   (chunk_filters.h); edge chunks stored unfiltered
//   (H5D_CHUNK_DONT_FILTER_PARTIAL_CHUNKS) are read as stored;
//   chunks holding several rows go through a small LRU cache with a byte
//   budget;
// - compact data (at most 64 KiB, stored in the object header) is read once
//   at open;
// - everything else (a filter registered with the library only, Fletcher-32,
//   external or virtual storage, unallocated chunks, a big-endian or n-bit
//   type) is read with H5Dread under the lock; layout() says which path each
//   file takes and why. A filter neither can decode is an error at open.
// Data files are opened on demand within max_open_files descriptors, so a
// source may span more files than the descriptor limit.
// Types: signed and unsigned integers of 8 to 64 bits (n-bit ones widened by
// H5Dread), bitfields (as unsigned integers, as h5py reads them),
// float16/32/64, bfloat16, and h5py's bool (an int8 enum FALSE/TRUE).
// Compound, string, variable-length, array, reference and opaque types
// cannot become a tensor and are rejected at open.
//
// Thread-safety: read_sample may run on many threads at once. Fork-safety: a
// process forked after the source was opened must not use it (the HDF5
// library's state and the mutex were copied mid-flight); read_sample there
// throws an Error that says so.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "leanloader/sources/source.h"

namespace leanloader {

namespace detail {
struct Hdf5Dataset;
struct Hdf5Files;
class ChunkCache;
}  // namespace detail

struct HDF5Field {
  std::string name;
  // A path or a glob pattern; the matches are sorted and their rows concatenated.
  // A file of that very name is read alone, glob characters in it or not.
  std::string files;
  // The dataset's path inside every file, e.g. "betas" or "/group/images".
  std::string dataset;
  // When set, row i of the field is row index[i] of the concatenated dataset.
  std::optional<std::vector<int64_t>> index;
};

struct HDF5SourceOptions {
  // Bytes of decoded chunks kept for chunks that hold several rows.
  size_t chunk_cache_bytes = size_t{64} << 20;
  // Data files held open at once (least recently read closed beyond it); 0
  // picks a quarter of the descriptor limit (ulimit -n), within [16, 512].
  size_t max_open_files = 0;
};

class HDF5Source final : public Source {
 public:
  // Opens every file, under the HDF5 mutex. Throws NotFound (IoError) when a
  // pattern matches nothing, FormatError for a file HDF5 cannot open or a
  // missing dataset, InvalidArgument for a type that cannot become a tensor,
  // files of one field that disagree on dtype or row shape, an index entry
  // out of range, or fields with different row counts.
  static std::shared_ptr<HDF5Source> open(std::vector<HDF5Field> fields,
                                          HDF5SourceOptions options = {});
  ~HDF5Source() override;
  HDF5Source(const HDF5Source&) = delete;
  HDF5Source& operator=(const HDF5Source&) = delete;

  int64_t size() const override { return rows_; }
  const std::vector<FieldSpec>& fields() const override { return specs_; }
  void read_sample(int64_t index, SampleWriter& writer) const override;
  std::string describe() const override { return description_; }
  std::string sample_location(int64_t index) const override;
  size_t estimated_sample_bytes() const override { return sample_bytes_; }
  size_t cache_budget_bytes() const override { return options_.chunk_cache_bytes; }
  // The largest stored chunk of a filtered dataset (read whole before it is
  // decoded) plus the largest decoded chunk that holds several rows (held
  // while its row is copied out, cached or not), plus what a read through
  // the HDF5 library leaves with the thread
  // (detail::Hdf5Dataset::library_chunk_bytes).
  size_t per_thread_scratch_bytes() const override { return scratch_bytes_; }
  // Called by the loader at each pass's start. A file written since it was
  // opened (h5py in "r+" mode, an append, a copy over it: device, inode,
  // size or modification time changed) may have moved its chunks, and
  // decoded chunks are kept: its rows would be the old ones, or another
  // chunk's bytes. So when any file changed, the same files (as matched at
  // open) are opened again and that source is returned, as h5py opening
  // them now would read them; the loader then reads it (its size may
  // differ). Returns nullptr while nothing changed (this source is its own
  // snapshot). Throws what open() throws when a file no longer opens.
  std::shared_ptr<const Source> snapshot() const override;
  // FormatError naming the first file written since this source opened it.
  void check_unchanged() const override;
  // Closes the files opened through the HDF5 library (datasets the fast
  // paths do not read): h5py in this process can then open them for
  // writing between passes, as it can the files read by pread.
  void pass_ended() const noexcept override;

  // The files of field `field`, in row order.
  std::vector<std::string> files(size_t field) const;
  // How each file of field `field` is read: "pread", "chunks", "memory", or
  // "library: <why>" (H5Dread under the mutex).
  std::vector<std::string> layout(size_t field) const;
  size_t chunk_cache_budget() const noexcept { return options_.chunk_cache_bytes; }
  // Bytes of decoded chunks held right now.
  size_t chunk_cache_bytes() const;
  // True when the HDF5 library in use was built thread-safe (we lock anyway).
  static bool library_threadsafe();
  // Data files this source may hold open at once, and holds open now.
  size_t open_file_budget() const noexcept;
  size_t open_file_count() const;

 private:
  struct Field {
    std::string name;
    std::string dataset;
    std::vector<std::shared_ptr<detail::Hdf5Dataset>> parts;
    std::vector<int64_t> starts;  // first concatenated row of each part
    int64_t rows = 0;             // concatenated rows
    std::shared_ptr<const std::vector<int64_t>> index;
  };

  // A field's files as matched at open, opened again by snapshot().
  struct Matched {
    std::string name;
    std::string pattern;  // as given, for messages
    std::string dataset;
    std::vector<std::string> paths;
    std::shared_ptr<const std::vector<int64_t>> index;  // shared by every reopening
  };

  HDF5Source() = default;
  static std::shared_ptr<HDF5Source> open_matched(std::vector<Matched> matched,
                                                  HDF5SourceOptions options);
  void read_field_row(size_t field, int64_t row, SampleWriter& writer) const;
  // Whether every file is still the one opened (device, inode, size,
  // modification time); with `or_throw`, a FormatError naming the first that
  // is not.
  bool files_unchanged(bool or_throw = false) const;

  std::vector<Field> fields_;
  std::vector<FieldSpec> specs_;
  HDF5SourceOptions options_;
  std::unique_ptr<detail::ChunkCache> cache_;
  size_t scratch_bytes_ = 0;
  std::shared_ptr<detail::Hdf5Files> files_;
  int64_t rows_ = 0;
  size_t sample_bytes_ = 0;
  std::string description_;
  pid_t owner_pid_ = 0;
  std::vector<Matched> matched_;
  // The source opened again after a file changed (null: none yet, this one
  // is current); taken and replaced under snapshot_mutex_.
  mutable std::mutex snapshot_mutex_;
  mutable std::shared_ptr<const HDF5Source> current_;
};

}  // namespace leanloader
