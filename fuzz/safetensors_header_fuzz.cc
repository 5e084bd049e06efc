// libFuzzer target for the safetensors header parser: arbitrary bytes are a
// whole file. The only acceptable failure is FormatError; anything else (a
// crash, a sanitizer report, another exception) is a bug. A header that
// parses must also satisfy the validated invariants and survive a round trip
// through the writer's header formatter.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "leanloader/core/checked_size.h"
#include "leanloader/core/error.h"
#include "leanloader/io/safetensors.h"

namespace {

using leanloader::SafetensorsHeader;

void check(bool condition) {
  if (!condition) std::abort();
}

SafetensorsHeader parse(const std::byte* data, size_t size) {
  return leanloader::parse_safetensors_header(std::span(data, size), size, "fuzz.safetensors");
}

// The invariants every accepted header promises its users.
void check_invariants(const SafetensorsHeader& header, size_t size) {
  uint64_t expected = 0;
  for (const auto& entry : header.tensors) {
    check(entry.begin == expected && entry.end >= entry.begin);
    // Bits, as the reference counts them: sub-byte tensors end on a byte.
    uint64_t nbits = leanloader::dtype_bits(entry.dtype);
    for (const int64_t dim : entry.shape) {
      check(dim >= 0);
      nbits *= static_cast<uint64_t>(dim);
    }
    check(nbits % 8 == 0);
    check(entry.end - entry.begin == nbits / 8);
    check(leanloader::checked_nbytes(entry.shape, entry.dtype) == nbits / 8);
    expected = entry.end;
  }
  check(header.data_offset >= 8 && header.data_offset + expected == size);
}

// Writes the parsed tensors again (views of the input, in the writer's
// order) and checks that the result parses to the same names, dtypes,
// shapes, bytes and metadata.
void check_round_trip(const SafetensorsHeader& header, const std::byte* data, size_t size) {
  auto storage =
      std::make_shared<leanloader::ExternalStorage>(const_cast<std::byte*>(data), size, nullptr);
  std::vector<std::pair<std::string, leanloader::Tensor>> tensors;
  for (const auto& entry : header.tensors) {
    tensors.emplace_back(
        entry.name,
        leanloader::Tensor(storage, static_cast<size_t>(header.data_offset + entry.begin),
                           entry.dtype, entry.shape));
  }
  std::optional<std::map<std::string, std::string>> metadata;
  if (header.has_metadata) metadata = header.metadata;
  std::vector<size_t> order;
  std::string json;
  try {
    json = leanloader::format_safetensors_header(tensors, metadata, &order);
  } catch (const leanloader::InvalidArgument&) {
    // Only the 100,000,000-byte cap can refuse what the parser accepted, and
    // inputs are far smaller than that.
    std::abort();
  }
  check(json.size() % 8 == 0);
  std::string file(8, '\0');
  for (int i = 0; i < 8; ++i)
    file[static_cast<size_t>(i)] = static_cast<char>(json.size() >> (8 * i));
  file += json;
  for (const size_t i : order) {
    const auto& tensor = tensors[i].second;
    file.append(reinterpret_cast<const char*>(tensor.data()), tensor.nbytes());
  }
  const auto* bytes = reinterpret_cast<const std::byte*>(file.data());
  const SafetensorsHeader again = parse(bytes, file.size());
  check(again.tensors.size() == header.tensors.size());
  check(again.metadata == header.metadata && again.has_metadata == header.has_metadata);
  check(again.data_offset % 8 == 0);
  for (size_t k = 0; k < order.size(); ++k) {
    const auto& before = header.tensors[order[k]];
    const auto& after = again.tensors[k];
    // Zero-sized tensors share offsets, so their relative order may differ.
    if (before.end == before.begin) continue;
    check(after.name == before.name && after.dtype == before.dtype && after.shape == before.shape);
    check(std::memcmp(bytes + again.data_offset + after.begin,
                      data + header.data_offset + before.begin, before.end - before.begin) == 0);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto* bytes = reinterpret_cast<const std::byte*>(data);
  SafetensorsHeader header;
  try {
    header = parse(bytes, size);
  } catch (const leanloader::FormatError&) {
    return 0;
  }
  check_invariants(header, size);
  check_round_trip(header, bytes, size);
  return 0;
}
