#include "leanloader/io/safetensors.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <string_view>
#include <unordered_set>

#include "io/file_io.h"
#include "io/json.h"
#include "leanloader/core/checked_size.h"
#include "leanloader/core/error.h"

namespace leanloader {

namespace {

constexpr std::string_view kMetadataKey = "__metadata__";

// A name from a file, for messages: control characters escaped, long names
// cut at a UTF-8 boundary, so that the message is short valid UTF-8.
std::string display_name(std::string_view name) {
  constexpr size_t kMax = 120;
  std::string_view shown = name;
  bool cut = false;
  if (shown.size() > kMax) {
    size_t end = kMax;
    while (end > 0 && (static_cast<unsigned char>(shown[end]) & 0xC0) == 0x80) --end;
    shown = shown.substr(0, end);
    cut = true;
  }
  std::string quoted;
  detail::append_json_string(quoted, shown);
  // append_json_string quotes with '"'; messages quote names with '\''.
  std::string out = "'";
  out.append(quoted, 1, quoted.size() - 2);
  if (cut) out += "...";
  out += '\'';
  return out;
}

std::string dims_to_string(const std::vector<uint64_t>& dims) {
  std::string out = "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(dims[i]);
  }
  return out + "]";
}

[[noreturn]] void format_error(const std::string& path, std::string_view rule,
                               const std::string& details) {
  throw FormatError("'" + path + "': " + std::string(rule) + ": " + details);
}

// The rank of each dtype in the reference's `Dtype` enum, whose derived Ord
// the reference writer sorts by (descending): BOOL, F4, F6_E2M3, F6_E3M2, U8,
// I8, F8_E5M2, F8_E4M3, F8_E8M0, F8_E4M3FNUZ, F8_E5M2FNUZ, I16, U16, F16,
// BF16, I32, U32, F32, C64, F64, I64, U64.
int reference_dtype_rank(DType dtype) noexcept {
  switch (dtype) {
    case DType::kBool:
      return 0;
    case DType::kF4:
      return 1;
    case DType::kF6E2M3:
      return 2;
    case DType::kF6E3M2:
      return 3;
    case DType::kU8:
      return 4;
    case DType::kI8:
      return 5;
    case DType::kF8E5M2:
      return 6;
    case DType::kF8E4M3:
      return 7;
    case DType::kF8E8M0:
      return 8;
    case DType::kF8E4M3Fnuz:
      return 9;
    case DType::kF8E5M2Fnuz:
      return 10;
    case DType::kI16:
      return 11;
    case DType::kU16:
      return 12;
    case DType::kF16:
      return 13;
    case DType::kBF16:
      return 14;
    case DType::kI32:
      return 15;
    case DType::kU32:
      return 16;
    case DType::kF32:
      return 17;
    case DType::kC64:
      return 18;
    case DType::kF64:
      return 19;
    case DType::kI64:
      return 20;
    case DType::kU64:
      return 21;
    case DType::kC128:
      break;  // never written: format_safetensors_header refuses it
  }
  return 0;
}

// An entry as parsed, before validation: dims stay unsigned 64-bit like the
// reference's usize so that the checks see the values the file holds.
struct ParsedEntry {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<uint64_t> dims;
  uint64_t begin = 0;
  uint64_t end = 0;
};

class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::string& path) : reader_(text), path_(path) {}

  void parse(std::vector<ParsedEntry>& entries, SafetensorsHeader& header) {
    if (reader_.peek() != detail::JsonReader::Kind::kObject) {
      reader_.fail("the header must be a JSON object");
    }
    reader_.begin_object();
    std::unordered_set<std::string> seen;
    std::string key;
    while (true) {
      const size_t key_offset = reader_.offset();
      if (!reader_.next_key(key)) break;
      if (!seen.insert(key).second) {
        format_error(path_, "DuplicateKey",
                     "key " + display_name(key) + " appears twice in the header (again near byte " +
                         std::to_string(key_offset) + "); each name must be unique");
      }
      if (key == kMetadataKey) {
        parse_metadata(header);
      } else {
        entries.push_back(parse_entry(std::move(key)));
        key.clear();
      }
    }
    reader_.expect_end();
  }

 private:
  void parse_metadata(SafetensorsHeader& header) {
    using Kind = detail::JsonReader::Kind;
    const Kind kind = reader_.peek();
    if (kind == Kind::kNull) {
      reader_.skip_value();  // the reference reads null as "no metadata"
      return;
    }
    if (kind != Kind::kObject) reader_.fail("__metadata__ must be an object of strings");
    header.has_metadata = true;
    reader_.begin_object();
    std::string key;
    while (true) {
      const size_t key_offset = reader_.offset();
      if (!reader_.next_key(key)) break;
      if (reader_.peek() != Kind::kString) {
        reader_.fail("__metadata__ value for key " + display_name(key) + " must be a string");
      }
      std::string value = reader_.read_string();
      if (!header.metadata.emplace(key, std::move(value)).second) {
        format_error(path_, "DuplicateKey",
                     "__metadata__ key " + display_name(key) + " appears twice (again near byte " +
                         std::to_string(key_offset) + ")");
      }
    }
  }

  ParsedEntry parse_entry(std::string name) {
    using Kind = detail::JsonReader::Kind;
    ParsedEntry entry;
    entry.name = std::move(name);
    const std::string shown = display_name(entry.name);
    if (reader_.peek() != Kind::kObject) {
      reader_.fail("tensor " + shown + " must be an object with dtype, shape and data_offsets");
    }
    reader_.begin_object();
    bool has_dtype = false;
    bool has_shape = false;
    bool has_offsets = false;
    std::string field;
    while (reader_.next_key(field)) {
      if (field == "dtype") {
        if (has_dtype) reader_.fail("duplicate field 'dtype' in tensor " + shown);
        has_dtype = true;
        if (reader_.peek() != Kind::kString) {
          reader_.fail("dtype of tensor " + shown + " must be a string");
        }
        const size_t at = reader_.offset();
        const std::string spelling = reader_.read_string();
        const std::optional<DType> dtype = dtype_from_name(spelling);
        if (!dtype || !dtype_in_safetensors(*dtype)) {
          reader_.fail_at("unknown dtype " + display_name(spelling) + " of tensor " + shown, at);
        }
        entry.dtype = *dtype;
      } else if (field == "shape") {
        if (has_shape) reader_.fail("duplicate field 'shape' in tensor " + shown);
        has_shape = true;
        if (reader_.peek() != Kind::kArray) {
          reader_.fail("shape of tensor " + shown + " must be an array of integers");
        }
        reader_.begin_array();
        while (reader_.next_element()) entry.dims.push_back(reader_.read_uint64());
      } else if (field == "data_offsets") {
        if (has_offsets) reader_.fail("duplicate field 'data_offsets' in tensor " + shown);
        has_offsets = true;
        if (reader_.peek() != Kind::kArray) {
          reader_.fail("data_offsets of tensor " + shown + " must be an array of 2 integers");
        }
        const size_t at = reader_.offset();
        reader_.begin_array();
        uint64_t offsets[2] = {0, 0};
        size_t count = 0;
        while (reader_.next_element()) {
          const uint64_t value = reader_.read_uint64();
          if (count < 2) offsets[count] = value;
          ++count;
        }
        if (count != 2) {
          reader_.fail_at("data_offsets of tensor " + shown + " has " + std::to_string(count) +
                              " elements, expected 2",
                          at);
        }
        entry.begin = offsets[0];
        entry.end = offsets[1];
      } else {
        reader_.skip_value();  // unknown fields are ignored, as by the reference
      }
    }
    const char* missing = !has_dtype     ? "dtype"
                          : !has_shape   ? "shape"
                          : !has_offsets ? "data_offsets"
                                         : nullptr;
    if (missing != nullptr) {
      reader_.fail("tensor " + shown + " has no '" + missing + "' field");
    }
    return entry;
  }

  detail::JsonReader reader_;
  const std::string& path_;
};

// Element count and byte size of an entry, following the reference's checked
// arithmetic; throws ValidationOverflow.
uint64_t entry_nbytes(const ParsedEntry& entry, const std::string& path) {
  uint64_t numel = 1;
  for (const uint64_t dim : entry.dims) {
    if (dim != 0 && numel > UINT64_MAX / dim) {
      format_error(path, "ValidationOverflow",
                   "tensor " + display_name(entry.name) + " has shape " +
                       dims_to_string(entry.dims) + ", whose element count overflows 64 bits");
    }
    numel *= dim;
  }
  // The reference counts bits (numel x bitsize, checked), then requires a
  // sub-byte tensor's bits to end on a byte boundary (MisalignedSlice).
  const uint64_t bits = dtype_bits(entry.dtype);
  if (numel > UINT64_MAX / bits) {
    format_error(path, "ValidationOverflow",
                 "tensor " + display_name(entry.name) + " has shape " + dims_to_string(entry.dims) +
                     " of " + std::string(dtype_name(entry.dtype)) +
                     ", whose size in bits overflows 64 bits");
  }
  if (numel * bits % 8 != 0) {
    format_error(path, "MisalignedSlice",
                 std::string(kSubbyteMisalignedMessage) + " (tensor " + display_name(entry.name) +
                     " has shape " + dims_to_string(entry.dims) + " of " +
                     std::string(dtype_name(entry.dtype)) + ": " + std::to_string(numel * bits) +
                     " bits)");
  }
  // Only reachable with a zero dimension beside a huge one: the reference
  // accepts it, but Shape is signed (as are torch and NumPy shapes).
  for (const uint64_t dim : entry.dims) {
    if (dim > static_cast<uint64_t>(INT64_MAX)) {
      format_error(path, "ValidationOverflow",
                   "tensor " + display_name(entry.name) + " has dimension " + std::to_string(dim) +
                       ", larger than 2^63-1");
    }
  }
  return numel * bits / 8;
}

// Runs the reference's Metadata::validate and the final coverage check.
void validate_entries(std::vector<ParsedEntry>& entries, uint64_t header_size, uint64_t file_size,
                      const std::string& path) {
  std::sort(entries.begin(), entries.end(), [](const ParsedEntry& a, const ParsedEntry& b) {
    if (a.begin != b.begin) return a.begin < b.begin;
    if (a.end != b.end) return a.end < b.end;
    return a.name < b.name;
  });
  uint64_t expected_begin = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    const ParsedEntry& entry = entries[i];
    const std::string offsets = dims_to_string({entry.begin, entry.end});
    if (entry.end < entry.begin) {
      format_error(path, "InvalidOffset",
                   "tensor " + display_name(entry.name) + " has data_offsets " + offsets +
                       ", which end before they begin");
    }
    if (entry.begin != expected_begin) {
      const std::string where = i == 0
                                    ? "the data buffer starts at 0"
                                    : "the previous tensor " + display_name(entries[i - 1].name) +
                                          " ends at " + std::to_string(expected_begin);
      format_error(path, "InvalidOffset",
                   "tensor " + display_name(entry.name) + " begins at " +
                       std::to_string(entry.begin) + " but " + where +
                       " (data offsets must be sorted, start at 0 and be contiguous)");
    }
    expected_begin = entry.end;
    const uint64_t nbytes = entry_nbytes(entry, path);
    if (entry.end - entry.begin != nbytes) {
      format_error(path, "TensorInvalidInfo",
                   "tensor " + display_name(entry.name) + " of " +
                       std::string(dtype_name(entry.dtype)) + " and shape " +
                       dims_to_string(entry.dims) + " needs " + std::to_string(nbytes) +
                       " bytes but its data_offsets " + offsets + " span " +
                       std::to_string(entry.end - entry.begin));
    }
  }
  const uint64_t data_size = expected_begin;
  const uint64_t data_offset = 8 + header_size;  // cannot overflow: header_size <= 1e8
  if (data_size > UINT64_MAX - data_offset || data_offset + data_size != file_size) {
    const std::string covered = data_size > UINT64_MAX - data_offset
                                    ? "more than 2^64-1"
                                    : std::to_string(data_offset + data_size);
    format_error(path, "MetadataIncompleteBuffer",
                 "the header and tensor data cover " + covered + " bytes but the file has " +
                     std::to_string(file_size) +
                     " (truncated, or trailing bytes; the data must end exactly at end of file)");
  }
}

}  // namespace

SafetensorsHeader parse_safetensors_header(std::span<const std::byte> file_bytes,
                                           uint64_t file_size,
                                           const std::string& path_for_messages) {
  const std::string& path = path_for_messages;
  if (file_size < 8 || file_bytes.size() < 8) {
    if (file_size < 8) {
      format_error(path, "HeaderTooSmall",
                   "the file has " + std::to_string(file_size) +
                       " bytes, fewer than the 8 of the header length");
    }
    throw InvalidArgument("parse_safetensors_header: only " + std::to_string(file_bytes.size()) +
                          " bytes of '" + path + "' were given, fewer than 8");
  }
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) {
    header_size = (header_size << 8) | static_cast<uint64_t>(file_bytes[static_cast<size_t>(i)]);
  }
  if (header_size > kSafetensorsMaxHeaderSize) {
    format_error(path, "HeaderTooLarge",
                 "the header length is " + std::to_string(header_size) +
                     " bytes, more than the limit of 100000000 (is this a Git LFS pointer or an "
                     "HTML page?)");
  }
  if (8 + header_size > file_size) {
    format_error(path, "InvalidHeaderLength",
                 "the header of " + std::to_string(header_size) + " bytes ends at byte " +
                     std::to_string(8 + header_size) + ", past the end of the file (" +
                     std::to_string(file_size) + " bytes)");
  }
  if (file_bytes.size() < 8 + header_size) {
    throw InvalidArgument("parse_safetensors_header: only " + std::to_string(file_bytes.size()) +
                          " bytes of '" + path + "' were given, fewer than the " +
                          std::to_string(8 + header_size) + " of its header");
  }
  const std::string_view text(reinterpret_cast<const char*>(file_bytes.data()) + 8,
                              static_cast<size_t>(header_size));
  if (const auto bad = detail::find_invalid_utf8(text)) {
    format_error(path, "InvalidHeader",
                 "the header is not valid UTF-8 (bad byte at offset " + std::to_string(*bad) +
                     " of the header)");
  }

  SafetensorsHeader header;
  std::vector<ParsedEntry> entries;
  try {
    HeaderParser(text, path).parse(entries, header);
  } catch (const detail::JsonError& e) {
    format_error(path, "InvalidHeaderDeserialization", e.what());
  }
  validate_entries(entries, header_size, file_size, path);

  header.data_offset = 8 + header_size;
  header.tensors.reserve(entries.size());
  for (ParsedEntry& parsed : entries) {
    SafetensorsEntry entry;
    entry.name = std::move(parsed.name);
    entry.dtype = parsed.dtype;
    entry.shape.assign(parsed.dims.begin(), parsed.dims.end());
    entry.begin = parsed.begin;
    entry.end = parsed.end;
    header.tensors.push_back(std::move(entry));
  }
  return header;
}

SafetensorsHeader read_safetensors_header(const std::string& path) {
  const detail::File file(path);
  const uint64_t file_size = file.size();
  std::vector<std::byte> bytes(std::min<uint64_t>(file_size, 8));
  file.read_exact(0, bytes);
  if (bytes.size() == 8) {
    uint64_t header_size = 0;
    for (int i = 7; i >= 0; --i) {
      header_size = (header_size << 8) | static_cast<uint64_t>(bytes[static_cast<size_t>(i)]);
    }
    // Read the header only when it is plausible; otherwise the parser
    // rejects the length from the first 8 bytes alone.
    if (header_size <= kSafetensorsMaxHeaderSize && 8 + header_size <= file_size) {
      bytes.resize(8 + header_size);
      file.read_exact(8, {bytes.data() + 8, header_size});
    }
  }
  return parse_safetensors_header(bytes, file_size, path);
}

SafetensorsFile::SafetensorsFile(std::shared_ptr<MappedFile> mapping, SafetensorsHeader header)
    : mapping_(std::move(mapping)), header_(std::move(header)) {
  index_.reserve(header_.tensors.size());
  for (size_t i = 0; i < header_.tensors.size(); ++i) index_.emplace(header_.tensors[i].name, i);
}

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  std::shared_ptr<MappedFile> mapping = MappedFile::open(path);
  const std::span<const std::byte> bytes(mapping->data(), mapping->size());
  SafetensorsHeader header = parse_safetensors_header(bytes, mapping->size(), path);
  return std::shared_ptr<SafetensorsFile>(
      new SafetensorsFile(std::move(mapping), std::move(header)));
}

std::optional<size_t> SafetensorsFile::find(const std::string& name) const {
  const auto it = index_.find(name);
  if (it == index_.end()) return std::nullopt;
  return it->second;
}

Tensor SafetensorsFile::tensor(const std::string& name) const {
  const std::optional<size_t> index = find(name);
  if (!index) {
    throw InvalidArgument("'" + path() + "' has no tensor " + display_name(name));
  }
  return tensor(*index);
}

Tensor SafetensorsFile::tensor(size_t index) const {
  if (index >= header_.tensors.size()) {
    throw InvalidArgument("tensor index " + std::to_string(index) + " out of range: '" + path() +
                          "' has " + std::to_string(header_.tensors.size()) + " tensors");
  }
  const SafetensorsEntry& entry = header_.tensors[index];
  const auto offset = static_cast<size_t>(header_.data_offset + entry.begin);
  const size_t itemsize = dtype_size(entry.dtype);
  const auto address = reinterpret_cast<uintptr_t>(mapping_->data() + offset);
  if (address % itemsize == 0) return Tensor(mapping_, offset, entry.dtype, entry.shape);
  // Third-party writers may skip the alignment padding; a misaligned pointer
  // is undefined behaviour for typed access and breaks torch and CUDA, so the
  // bytes are copied into an aligned buffer instead.
  const auto nbytes = static_cast<size_t>(entry.end - entry.begin);
  std::shared_ptr<HeapStorage> copy = HeapStorage::allocate(nbytes);
  std::memcpy(copy->data(), mapping_->data() + offset, nbytes);
  return Tensor(std::move(copy), 0, entry.dtype, entry.shape);
}

std::string format_safetensors_header(
    const std::vector<std::pair<std::string, Tensor>>& tensors,
    const std::optional<std::map<std::string, std::string>>& metadata,
    std::vector<size_t>* write_order) {
  std::set<std::string_view> names;
  for (const auto& [name, tensor] : tensors) {
    if (name == kMetadataKey) {
      throw InvalidArgument(
          "a tensor cannot be named '__metadata__': that key holds the file's metadata");
    }
    if (!names.insert(name).second) {
      throw InvalidArgument("tensor name " + display_name(name) + " is given twice");
    }
    if (tensor.storage() == nullptr) {
      throw InvalidArgument("tensor " + display_name(name) + " has no storage");
    }
    if (!dtype_in_safetensors(tensor.dtype())) {
      throw InvalidArgument("tensor " + display_name(name) + " is " +
                            std::string(dtype_name(tensor.dtype())) +
                            ", which safetensors has no dtype for (complex64 is C64)");
    }
    if (detail::find_invalid_utf8(name)) {
      throw InvalidArgument("tensor name " + display_name(name) + " is not valid UTF-8");
    }
  }
  if (metadata) {
    for (const auto& [key, value] : *metadata) {
      if (detail::find_invalid_utf8(key) || detail::find_invalid_utf8(value)) {
        throw InvalidArgument("metadata entry " + display_name(key) + " is not valid UTF-8");
      }
    }
  }

  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const int rank_a = reference_dtype_rank(tensors[a].second.dtype());
    const int rank_b = reference_dtype_rank(tensors[b].second.dtype());
    if (rank_a != rank_b) return rank_a > rank_b;
    return tensors[a].first < tensors[b].first;
  });

  // serde_json's compact form, in the reference's member order.
  std::string json = "{";
  bool first = true;
  if (metadata) {
    json += "\"__metadata__\":{";
    bool first_entry = true;
    for (const auto& [key, value] : *metadata) {
      if (!first_entry) json += ',';
      first_entry = false;
      detail::append_json_string(json, key);
      json += ':';
      detail::append_json_string(json, value);
    }
    json += '}';
    first = false;
  }
  uint64_t offset = 0;
  for (const size_t i : order) {
    const Tensor& tensor = tensors[i].second;
    if (!first) json += ',';
    first = false;
    detail::append_json_string(json, tensors[i].first);
    json += ":{\"dtype\":\"";
    json += dtype_name(tensor.dtype());
    json += "\",\"shape\":[";
    for (size_t d = 0; d < tensor.shape().size(); ++d) {
      if (d > 0) json += ',';
      json += std::to_string(tensor.shape()[d]);
    }
    const uint64_t end = offset + tensor.nbytes();
    json += "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(end) + "]}";
    offset = end;
  }
  json += '}';
  json.append((8 - json.size() % 8) % 8, ' ');
  if (json.size() > kSafetensorsMaxHeaderSize) {
    throw InvalidArgument("the safetensors header would be " + std::to_string(json.size()) +
                          " bytes, more than the limit of 100000000");
  }
  if (write_order != nullptr) *write_order = std::move(order);
  return json;
}

void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::optional<std::map<std::string, std::string>>& metadata) {
  std::vector<size_t> order;
  const std::string header = format_safetensors_header(tensors, metadata, &order);

  detail::AtomicFileWriter out(path);
  std::byte length[8];
  const uint64_t header_size = header.size();
  for (int i = 0; i < 8; ++i) length[i] = static_cast<std::byte>(header_size >> (8 * i));
  out.write(length, sizeof(length));
  out.write(header);
  std::vector<std::byte> scratch;
  for (const size_t i : order) {
    const Tensor& tensor = tensors[i].second;
    if (tensor.nbytes() == 0) continue;
    if (tensor.is_contiguous()) {
      out.write(tensor.data(), tensor.nbytes());
    } else {
      scratch.resize(tensor.nbytes());
      tensor.copy_to(scratch.data());
      out.write(scratch.data(), scratch.size());
    }
  }
  out.commit();
}

}  // namespace leanloader
