// libFuzzer target: HDF5 chunk decoding (the filter pipeline reversed by
// leanloader: shuffle, deflate, lz4, zstd, Blosc, LZF) over crafted chunk bytes.
//
// Input: byte 0 picks the pipeline (bit 0: shuffle first; bits 1-3: none,
// deflate, lz4, zstd, Blosc, LZF), byte 1 the element size, bytes 2-3 the chunk size
// (little-endian), byte 4 the filter mask; the rest is the stored chunk. A
// FormatError is the only acceptable failure; anything else (a crash, a
// sanitizer report, another exception) is a bug.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "leanloader/core/error.h"
#include "leanloader/hdf5/chunk_filters.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 5) return 0;
  std::vector<leanloader::Hdf5Filter> filters;
  if (data[0] & 1) filters.push_back({leanloader::kHdf5FilterShuffle, {}, "shuffle"});
  static constexpr int kCompressors[] = {0,
                                         leanloader::kHdf5FilterDeflate,
                                         leanloader::kHdf5FilterLz4,
                                         leanloader::kHdf5FilterZstd,
                                         leanloader::kHdf5FilterBlosc,
                                         leanloader::kHdf5FilterLzf,
                                         0,
                                         0};
  if (const int id = kCompressors[(data[0] >> 1) & 7]; id != 0) filters.push_back({id, {}, ""});
  const size_t element_size = size_t{data[1]} % 17;
  const size_t chunk_bytes = size_t{data[2]} | (size_t{data[3]} << 8);
  const uint32_t mask = data[4];
  const std::span<const std::byte> raw(reinterpret_cast<const std::byte*>(data + 5), size - 5);
  try {
    const std::vector<std::byte> out =
        leanloader::decode_chunk(raw, filters, mask, chunk_bytes, element_size);
    if (out.size() != chunk_bytes) __builtin_trap();  // the contract: exactly chunk_bytes
  } catch (const leanloader::FormatError&) {
  }
  return 0;
}
