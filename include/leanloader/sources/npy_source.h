// NpySource: samples from .npy files.
//
// Two layouts:
// - arrays: one .npy per field; row i of every file is sample i. A C-order
//   row above 64 KiB is read with pread straight into the batch slot (no page
//   faults in this process; a row not in the page cache is noticed, and the
//   loader then announces the next rows so that many are read at once),
//   unless the row is in memory and its batch wants streaming stores (a
//   batch of several MiB: SampleWriter::prefers_streaming_stores), when it
//   is copied from a mapping of the file with those; smaller rows are copied
//   from a mapping of the file (a pread per row cost as much as the copy);
//   Fortran-ordered arrays are memory-mapped and their strided rows
//   gathered. Either way the pages are page cache, shared by every thread
//   and process.
// - directory: one .npy per sample (sorted by name), a single field; each
//   read opens the file and preads its data straight into the batch slot.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "leanloader/core/storage.h"
#include "leanloader/io/npy_format.h"
#include "leanloader/sources/source.h"

namespace leanloader {

namespace detail {
class File;
class ReadAround;
}  // namespace detail

class NpySource final : public Source {
 public:
  // Arrays layout: (field name, path) pairs. Throws FormatError for a bad
  // file, IoError when one cannot be opened, InvalidArgument when the files
  // disagree on the number of rows.
  static std::shared_ptr<NpySource> from_arrays(
      const std::vector<std::pair<std::string, std::string>>& fields);
  // Directory layout: every *.npy file in `directory`, sorted by name.
  static std::shared_ptr<NpySource> from_directory(const std::string& field_name,
                                                   const std::string& directory);

  int64_t size() const override { return rows_; }
  const std::vector<FieldSpec>& fields() const override { return specs_; }
  void read_sample(int64_t index, SampleWriter& writer) const override;
  std::string describe() const override { return description_; }
  std::string sample_location(int64_t index) const override;
  size_t estimated_sample_bytes() const override { return sample_bytes_; }
  // Rows read with pread (above 64 KiB, C order) are read without waiting
  // first; one that was not in the page cache counts here.
  uint64_t storage_reads() const override { return storage_reads_.load(); }
  // C-order rows of mapped arrays: every page of the row is in the page
  // cache (mincore). Rows of a directory's files and Fortran-order rows:
  // true (not told).
  bool in_memory(int64_t index) const noexcept override;
  void will_need(int64_t index) const noexcept override;
  // C-order rows of a file that fits in memory, on a device that reads
  // ahead more than a row around a fault: the aligned read-ahead window
  // holding the row, once per window (src/io/read_around.h). The loader
  // calls it while rows come from storage: pread rows that missed, or page
  // faults that waited for storage while rows were copied from the mapping.
  void will_need_around(int64_t index) const noexcept override;
  void will_read(int64_t index) const noexcept override;

 private:
  struct MappedArray {
    std::string path;
    std::shared_ptr<detail::File> reader;  // pread_rows: rows are pread
    // Fortran order: rows are gathered from it; C order, small rows: rows
    // are copied from it (guarded against the file shrinking); pread_rows:
    // rows in memory are copied from it when the batch wants streaming
    // stores. Null for an empty array.
    std::shared_ptr<MappedFile> mapping;
    bool pread_rows = false;  // C order, rows above 64 KiB
    // C order: reads the windows around cold rows; null where that does
    // not pay (ReadAround::for_rows).
    std::shared_ptr<const detail::ReadAround> read_around;
    NpyHeader header;
    Shape row_shape;
    Shape row_strides;    // elements
    size_t row_step = 0;  // bytes between rows

    // Where row `index` starts in the file (index in range: checked at open
    // that every row fits).
    size_t row_offset(int64_t index) const {
      return header.data_offset + static_cast<size_t>(index) * row_step;
    }
  };

  NpySource() = default;
  void read_from_arrays(int64_t index, SampleWriter& writer) const;
  void read_from_file(int64_t index, SampleWriter& writer) const;

  std::vector<MappedArray> arrays_;
  std::vector<std::string> files_;  // directory layout
  std::vector<FieldSpec> specs_;
  int64_t rows_ = 0;
  size_t sample_bytes_ = 0;
  std::string description_;
  mutable std::atomic<uint64_t> storage_reads_{0};
};

}  // namespace leanloader
