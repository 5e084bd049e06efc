// safetensors: reading and writing files byte-compatible with the reference
// implementation (huggingface/safetensors).
//
// Layout: 8 bytes N (u64 little-endian), N bytes of UTF-8 JSON header, then
// the data buffer; every tensor is a dense row-major little-endian byte range
// [begin, end) of the buffer, named in the header.
//
// The reader validates as strictly as the reference reader, rule by rule and
// in its order, and throws FormatError("'<path>': <Rule>: <details>") naming
// the reference's rule:
//   HeaderTooSmall                the file is shorter than 8 bytes
//   HeaderTooLarge                N > 100,000,000
//   InvalidHeaderLength           8 + N is past the end of the file
//   InvalidHeader                 the header is not UTF-8
//   InvalidHeaderDeserialization  not a JSON object of the expected shape: bad
//                                 JSON, wrong type, missing field, unknown
//                                 dtype, negative or non-integer dim/offset,
//                                 non-string metadata value
//   DuplicateKey                  a tensor name, "__metadata__" or a metadata
//                                 key appears twice (stricter than the
//                                 reference, which keeps the last one)
//   InvalidOffset                 offsets, sorted, do not start at 0 and run
//                                 contiguously (holes, overlaps, end < begin)
//   ValidationOverflow            shape product x dtype size overflows 64 bits
//   TensorInvalidInfo             end - begin != shape product x dtype size
//   MetadataIncompleteBuffer      the data does not end exactly at end of file
// Unknown per-tensor fields are ignored, as by the reference.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "leanloader/core/dtype.h"
#include "leanloader/core/storage.h"
#include "leanloader/core/tensor.h"

namespace leanloader {

// The reference's limit on N, enforced on read and on write.
inline constexpr uint64_t kSafetensorsMaxHeaderSize = 100'000'000;

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kU8;
  Shape shape;
  // Byte range in the data buffer, relative to its start (data_offset).
  uint64_t begin = 0;
  uint64_t end = 0;
};

struct SafetensorsHeader {
  // In file order: sorted by offset, contiguous from 0.
  std::vector<SafetensorsEntry> tensors;
  std::map<std::string, std::string> metadata;
  // Whether the header has a "__metadata__" object (it may be empty).
  bool has_metadata = false;
  // Absolute file offset of the data buffer: 8 + N.
  uint64_t data_offset = 0;
};

// Parses and validates a whole safetensors header.
//
// `file_bytes` is the start of the file: at least its first 8 + N bytes (the
// whole mapped file will do); `file_size` is the length of the whole file,
// against which offsets are checked. Throws FormatError naming
// `path_for_messages` and the rule (see above), or InvalidArgument when
// `file_bytes` is shorter than the header it announces although the file is
// long enough. Never reads outside `file_bytes`. Thread-safe (pure function).
SafetensorsHeader parse_safetensors_header(std::span<const std::byte> file_bytes,
                                           uint64_t file_size,
                                           const std::string& path_for_messages);

// Reads only the header of the file at `path` (two preads, no mapping) and
// validates it against the file's length. Throws IoError / FormatError.
SafetensorsHeader read_safetensors_header(const std::string& path);

// A validated safetensors file, memory-mapped (copy-on-write private mapping:
// pages are the shared page cache until someone writes into a tensor).
//
// Thread-safety: immutable after open(); tensor() may be called from any
// thread. Lifetime: each Tensor keeps the mapping alive, so tensors outlive
// the SafetensorsFile they came from.
class SafetensorsFile {
 public:
  // Throws IoError (kNotFound for a missing file) or FormatError.
  static std::shared_ptr<SafetensorsFile> open(const std::string& path);

  const std::string& path() const noexcept { return mapping_->path(); }
  const SafetensorsHeader& header() const noexcept { return header_; }
  const std::shared_ptr<MappedFile>& mapping() const noexcept { return mapping_; }
  size_t size() const noexcept { return header_.tensors.size(); }

  // Index of the tensor called `name` in header().tensors, or nullopt.
  std::optional<size_t> find(const std::string& name) const;

  // The tensor as a zero-copy view of the mapping when its first byte is
  // aligned for its dtype (files written by the reference writer or ours
  // always are); otherwise a copy in aligned HeapStorage, so that no
  // consumer ever sees a misaligned pointer. Throws InvalidArgument for an
  // unknown name or an index out of range.
  Tensor tensor(const std::string& name) const;
  Tensor tensor(size_t index) const;

 private:
  SafetensorsFile(std::shared_ptr<MappedFile> mapping, SafetensorsHeader header);

  std::shared_ptr<MappedFile> mapping_;
  SafetensorsHeader header_;
  std::unordered_map<std::string, size_t> index_;
};

// Builds the header bytes (JSON padded with spaces to a multiple of 8, without
// the 8-byte length) exactly as the reference writer would for these tensors,
// and returns the tensors' write order: by dtype descending in the
// reference's dtype order (so each tensor starts aligned to its element
// size), then by name. Metadata keys are written in sorted order (the
// reference writes them in hash order). Throws InvalidArgument for a tensor
// named "__metadata__", a duplicate name, a tensor without storage, a name or
// metadata string that is not UTF-8, or a header over 100,000,000 bytes.
std::string format_safetensors_header(
    const std::vector<std::pair<std::string, Tensor>>& tensors,
    const std::optional<std::map<std::string, std::string>>& metadata,
    std::vector<size_t>* write_order);

// Writes `tensors` to `path` in the reference layout, atomically: the bytes
// go to "<path>.tmp.<pid>.<random>" in the same directory, which is fsynced
// and renamed over `path`, and the directory is fsynced. A crash leaves the
// old file or the new one, never a partial one. Non-contiguous tensors are
// written in row-major order. `metadata` nullopt writes no "__metadata__";
// an empty map writes an empty one. Throws InvalidArgument (see
// format_safetensors_header) before touching the disk, or IoError naming the
// path after removing the temporary file.
void save_safetensors(
    const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
    const std::optional<std::map<std::string, std::string>>& metadata = std::nullopt);

}  // namespace leanloader
