#include "leanloader/hdf5/chunk_filters.h"

#include <blosc.h>
#include <lz4.h>
#include <lzf.h>
#include <zstd.h>

#include <climits>
#include <cstring>

#include "io/zlib_inflate.h"
#include "leanloader/core/checked_size.h"
#include "leanloader/core/error.h"

namespace leanloader {

namespace {

std::string filter_label(const Hdf5Filter& filter) {
  std::string label = filter.name.empty() ? std::string("filter") : "'" + filter.name + "'";
  return label + " (id " + std::to_string(filter.id) + ")";
}

[[noreturn]] void corrupt(const Hdf5Filter& filter, const std::string& cause) {
  throw FormatError("corrupt chunk: " + filter_label(filter) + ": " + cause);
}

uint32_t load_be32(const std::byte* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}

uint64_t load_be64(const std::byte* p) { return (uint64_t(load_be32(p)) << 32) | load_be32(p + 4); }

void inflate_into(const Hdf5Filter& filter, std::span<const std::byte> in,
                  std::span<std::byte> out) {
  size_t produced = 0;
  switch (detail::zlib_inflate(in, out, produced)) {
    case detail::InflateResult::kOk:
      if (produced != out.size()) {
        corrupt(filter, "inflates to " + std::to_string(produced) + " bytes, expected " +
                            std::to_string(out.size()));
      }
      return;
    case detail::InflateResult::kOutOfMemory:
      throw OutOfMemory("libdeflate: cannot allocate");
    case detail::InflateResult::kNoRoom:
      corrupt(filter, "inflates past the expected " + std::to_string(out.size()) + " bytes");
    case detail::InflateResult::kCorrupt:
      break;
  }
  corrupt(filter, "not a valid zlib/deflate stream of " + std::to_string(in.size()) + " bytes");
}

void zstd_into(const Hdf5Filter& filter, std::span<const std::byte> in, std::span<std::byte> out) {
  const size_t result = ZSTD_decompress(out.data(), out.size(), in.data(), in.size());
  if (ZSTD_isError(result)) corrupt(filter, std::string("zstd: ") + ZSTD_getErrorName(result));
  if (result != out.size()) {
    corrupt(filter, "decompresses to " + std::to_string(result) + " bytes, expected " +
                        std::to_string(out.size()));
  }
}

// The HDF5 LZ4 plugin's framing (H5Zlz4.c): a big-endian 8-byte original size
// and 4-byte block size, then per block a big-endian 4-byte compressed size
// and the block; a block whose compressed size equals its size is stored raw.
void lz4_into(const Hdf5Filter& filter, std::span<const std::byte> in, std::span<std::byte> out) {
  if (in.size() < 12) corrupt(filter, "shorter than its 12-byte header");
  const uint64_t original = load_be64(in.data());
  uint64_t block_size = load_be32(in.data() + 8);
  if (original != out.size()) {
    corrupt(filter, "header says " + std::to_string(original) + " bytes, expected " +
                        std::to_string(out.size()));
  }
  if (block_size == 0 && original > 0) corrupt(filter, "block size 0");
  if (block_size > original) block_size = original;
  size_t read = 12;
  size_t written = 0;
  while (written < out.size()) {
    const size_t this_block = std::min<size_t>(block_size, out.size() - written);
    if (!range_fits(read, 4, in.size())) corrupt(filter, "ends before a block header");
    const size_t compressed = load_be32(in.data() + read);
    read += 4;
    if (!range_fits(read, compressed, in.size())) {
      corrupt(filter, "a block of " + std::to_string(compressed) + " bytes runs past the chunk's " +
                          std::to_string(in.size()));
    }
    if (compressed == this_block) {
      std::memcpy(out.data() + written, in.data() + read, this_block);
    } else {
      if (compressed > INT_MAX || this_block > INT_MAX) corrupt(filter, "block too large");
      const int got =
          LZ4_decompress_safe(reinterpret_cast<const char*>(in.data() + read),
                              reinterpret_cast<char*>(out.data() + written),
                              static_cast<int>(compressed), static_cast<int>(this_block));
      if (got < 0 || static_cast<size_t>(got) != this_block) {
        corrupt(filter, "lz4 block at byte " + std::to_string(read) + " does not decode to " +
                            std::to_string(this_block) + " bytes");
      }
    }
    read += compressed;
    written += this_block;
  }
}

// PyTables' and hdf5plugin's Blosc filter stores each chunk as one Blosc
// buffer (its own header: sizes, shuffle, codec). blosc_decompress_ctx uses
// no global state, so worker threads decode side by side.
void blosc_into(const Hdf5Filter& filter, std::span<const std::byte> in, std::span<std::byte> out) {
  size_t expected = 0;
  if (blosc_cbuffer_validate(in.data(), in.size(), &expected) != 0) {
    corrupt(filter, "not a valid Blosc buffer of " + std::to_string(in.size()) + " bytes");
  }
  if (expected != out.size()) {
    corrupt(filter, "Blosc header says " + std::to_string(expected) + " bytes, expected " +
                        std::to_string(out.size()));
  }
  const int got = blosc_decompress_ctx(in.data(), out.data(), out.size(), 1);
  if (got < 0 || static_cast<size_t>(got) != out.size()) {
    corrupt(filter, "Blosc cannot decompress it (" + std::to_string(got) + ")");
  }
}

// h5py's LZF filter: the chunk is one LZF block (no header); h5py stores a
// chunk LZF cannot shrink unfiltered, with the filter's bit set in the mask.
void lzf_into(const Hdf5Filter& filter, std::span<const std::byte> in, std::span<std::byte> out) {
  if (in.size() > UINT_MAX || out.size() > UINT_MAX) corrupt(filter, "chunk too large for LZF");
  const unsigned got = lzf_decompress(in.data(), static_cast<unsigned>(in.size()), out.data(),
                                      static_cast<unsigned>(out.size()));
  if (got != out.size()) {
    corrupt(filter, got == 0 ? std::string("not a valid LZF block of ") +
                                   std::to_string(in.size()) + " bytes"
                             : "decompresses to " + std::to_string(got) + " bytes, expected " +
                                   std::to_string(out.size()));
  }
}

// Reverses HDF5's byte shuffle: byte j of element i was stored at j * n + i.
void unshuffle_into(std::span<const std::byte> in, std::span<std::byte> out, size_t element) {
  if (in.empty()) return;  // an empty chunk's spans may hold null pointers
  const size_t n = in.size() / element;
  for (size_t j = 0; j < element; ++j) {
    const std::byte* plane = in.data() + j * n;
    std::byte* dst = out.data() + j;
    for (size_t i = 0; i < n; ++i) dst[i * element] = plane[i];
  }
  const size_t tail = n * element;
  std::memcpy(out.data() + tail, in.data() + tail, in.size() - tail);
}

}  // namespace

bool hdf5_filter_supported(int id) noexcept {
  return id == kHdf5FilterDeflate || id == kHdf5FilterShuffle || id == kHdf5FilterLz4 ||
         id == kHdf5FilterZstd || id == kHdf5FilterBlosc || id == kHdf5FilterLzf;
}

void decode_chunk_into(std::span<const std::byte> raw, const std::vector<Hdf5Filter>& filters,
                       uint32_t filter_mask, std::span<std::byte> out, size_t element_size) {
  std::vector<size_t> active;
  for (size_t k = filters.size(); k-- > 0;) {
    if (k < 32 && (filter_mask >> k) & 1u) continue;
    if (!hdf5_filter_supported(filters[k].id)) {
      throw InvalidArgument("HDF5 " + filter_label(filters[k]) + " is not decoded by leanloader");
    }
    active.push_back(k);
  }
  // Every supported filter preserves the size once reversed: each stage
  // produces exactly out.size() bytes, ping-ponging between two buffers and
  // writing the last stage straight into `out`.
  // Scratch is kept per thread, so steady-state decoding allocates (and
  // page-faults) nothing; chunks above kKeptScratchBytes use a local buffer.
  constexpr size_t kKeptScratchBytes = size_t{64} << 20;
  thread_local std::vector<std::byte> kept[2];
  std::vector<std::byte> local[2];
  std::vector<std::byte>* scratch = out.size() <= kKeptScratchBytes ? kept : local;
  std::span<const std::byte> current = raw;
  if (active.empty()) {
    if (raw.size() != out.size()) {
      throw FormatError("corrupt chunk: " + std::to_string(raw.size()) +
                        " bytes stored for an unfiltered chunk of " + std::to_string(out.size()));
    }
    if (!raw.empty()) std::memcpy(out.data(), raw.data(), raw.size());  // empty: may be null
    return;
  }
  for (size_t step = 0; step < active.size(); ++step) {
    const Hdf5Filter& filter = filters[active[step]];
    std::span<std::byte> target = out;
    if (step + 1 < active.size()) {
      std::vector<std::byte>& buffer = scratch[step % 2];
      if (buffer.size() < out.size()) buffer.resize(out.size());
      target = std::span<std::byte>(buffer.data(), out.size());
    }
    switch (filter.id) {
      case kHdf5FilterDeflate:
        inflate_into(filter, current, target);
        break;
      case kHdf5FilterZstd:
        zstd_into(filter, current, target);
        break;
      case kHdf5FilterLz4:
        lz4_into(filter, current, target);
        break;
      case kHdf5FilterBlosc:
        blosc_into(filter, current, target);
        break;
      case kHdf5FilterLzf:
        lzf_into(filter, current, target);
        break;
      case kHdf5FilterShuffle: {
        if (current.size() != target.size()) {
          corrupt(filter, std::to_string(current.size()) + " bytes, expected " +
                              std::to_string(target.size()));
        }
        const size_t element =
            filter.client_data.empty() ? element_size : size_t{filter.client_data[0]};
        if (element <= 1) {
          // An empty chunk's spans may hold null pointers, which memcpy must not get.
          if (!current.empty()) std::memcpy(target.data(), current.data(), current.size());
        } else {
          unshuffle_into(current, target, element);
        }
        break;
      }
      default:
        break;  // unreachable: checked above
    }
    current = target;
  }
}

std::vector<std::byte> decode_chunk(std::span<const std::byte> raw,
                                    const std::vector<Hdf5Filter>& filters, uint32_t filter_mask,
                                    size_t chunk_bytes, size_t element_size) {
  std::vector<std::byte> out(chunk_bytes);
  decode_chunk_into(raw, filters, filter_mask, out, element_size);
  return out;
}

}  // namespace leanloader
