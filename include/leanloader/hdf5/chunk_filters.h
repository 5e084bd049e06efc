// The HDF5 filter pipeline run in reverse by leanloader itself, so that raw
// chunks read with pread are decoded in the worker threads, outside the HDF5
// library and its global lock.
//
// Contract: decode_chunk() is pure (no HDF5 call, no shared state) and
// thread-safe. The raw bytes are untrusted: every size comes from the bytes
// or the caller and is checked; a malformed chunk throws FormatError with the
// filter and the cause, never reads or writes out of bounds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace leanloader {

// HDF5 filter identifiers (H5Zpublic.h and the registered plugin ids).
inline constexpr int kHdf5FilterDeflate = 1;
inline constexpr int kHdf5FilterShuffle = 2;
inline constexpr int kHdf5FilterFletcher32 = 3;
inline constexpr int kHdf5FilterLzf = 32000;    // h5py's
inline constexpr int kHdf5FilterBlosc = 32001;  // PyTables', hdf5plugin's
inline constexpr int kHdf5FilterLz4 = 32004;
inline constexpr int kHdf5FilterZstd = 32015;

// One stage of a dataset's filter pipeline, in the order the writer applied them.
struct Hdf5Filter {
  int id = 0;
  std::vector<unsigned> client_data;  // cd_values from the dataset creation properties
  std::string name;                   // as stored in the file, for messages
};

// True when decode_chunk can reverse filter `id` itself.
bool hdf5_filter_supported(int id) noexcept;

// Reverses `filters` (applied by the writer first to last) over `raw`, skipping
// filter k when bit k of `filter_mask` is set (the writer skipped it for this
// chunk). The result must be exactly `chunk_bytes` long. `element_size` is the
// dataset's element size (the shuffle filter's default). Throws FormatError
// naming the filter on a corrupt or wrongly sized chunk, InvalidArgument for a
// filter hdf5_filter_supported() rejects.
std::vector<std::byte> decode_chunk(std::span<const std::byte> raw,
                                    const std::vector<Hdf5Filter>& filters, uint32_t filter_mask,
                                    size_t chunk_bytes, size_t element_size);

// As decode_chunk, writing the chunk's exactly out.size() bytes into `out`
// (a batch row when one chunk is one sample, so no copy follows).
void decode_chunk_into(std::span<const std::byte> raw, const std::vector<Hdf5Filter>& filters,
                       uint32_t filter_mask, std::span<std::byte> out, size_t element_size);

}  // namespace leanloader
