// SharedRecords: many small byte records (serialized Python records: dicts,
// tuples, strings) packed into one SharedSegment with an offset index.
//
// Why: a Python list of N objects read by N worker processes is copied page
// by page into every worker (CPython writes reference counts into each object
// it reads), or pickled whole into every worker under spawn. One flat buffer
// plus an offsets array has no per-object headers to write, so every process
// maps the same pages and decodes only the record it reads.
//
// Layout (little-endian, 8-byte aligned):
//   [0, 8)            magic "LLRECS01"
//   [8, 16)           count N (uint64)
//   [16, 16+8(N+1))   offsets of record i from the start of the data area;
//                     offsets[N] is the data size; non-decreasing
//   [.., ..)          data area
// attach() validates the layout before use, so a foreign or truncated segment
// is a FormatError, not an out-of-bounds read.
//
// Thread-safety: immutable after construction; record() may be called from
// any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "leanloader/workers/shared_segment.h"

namespace leanloader {

class SharedRecords {
 public:
  // Packs `records` into a new segment in `dir` (see SharedSegment::create).
  static std::shared_ptr<SharedRecords> pack(const std::vector<std::string_view>& records,
                                             const std::string& dir = "");
  // Wraps a segment written by pack() (in this or another process).
  // Throws FormatError when the layout is not valid.
  static std::shared_ptr<SharedRecords> attach(std::shared_ptr<SharedSegment> segment);

  size_t size() const noexcept { return count_; }
  // The bytes of record i; valid while this object lives. Throws
  // InvalidArgument (an IndexError in Python) for i >= size().
  std::span<const std::byte> record(size_t i) const;
  // Bytes of the data area (the records without the index).
  size_t data_bytes() const noexcept { return data_bytes_; }
  const std::shared_ptr<SharedSegment>& segment() const noexcept { return segment_; }

 private:
  SharedRecords(std::shared_ptr<SharedSegment> segment, size_t count, const uint64_t* offsets,
                const std::byte* data, size_t data_bytes);

  std::shared_ptr<SharedSegment> segment_;
  size_t count_;
  const uint64_t* offsets_;
  const std::byte* data_;
  size_t data_bytes_;
};

}  // namespace leanloader
