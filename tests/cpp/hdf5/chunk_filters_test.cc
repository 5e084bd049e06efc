#include "leanloader/hdf5/chunk_filters.h"

#include <blosc.h>
#include <gtest/gtest.h>
#include <lz4.h>
#include <lzf.h>
#include <zlib.h>
#include <zstd.h>

#include <cstring>
#include <numeric>

#include "leanloader/core/error.h"

namespace leanloader {
namespace {

std::vector<std::byte> sample_bytes(size_t count) {
  std::vector<std::byte> out(count);
  for (size_t i = 0; i < count; ++i) out[i] = std::byte(static_cast<uint8_t>((i * 7) / 5));
  return out;
}

// HDF5's shuffle: byte j of element i goes to j * n + i.
std::vector<std::byte> shuffle(const std::vector<std::byte>& in, size_t element) {
  std::vector<std::byte> out(in);
  const size_t n = in.size() / element;
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j < element; ++j) out[j * n + i] = in[i * element + j];
  return out;
}

std::vector<std::byte> deflate(const std::vector<std::byte>& in) {
  uLongf size = compressBound(in.size());
  std::vector<std::byte> out(size);
  EXPECT_EQ(compress2(reinterpret_cast<Bytef*>(out.data()), &size,
                      reinterpret_cast<const Bytef*>(in.data()), in.size(), 1),
            Z_OK);
  out.resize(size);
  return out;
}

std::vector<std::byte> zstd(const std::vector<std::byte>& in) {
  std::vector<std::byte> out(ZSTD_compressBound(in.size()));
  out.resize(ZSTD_compress(out.data(), out.size(), in.data(), in.size(), 3));
  return out;
}

void put_be(std::vector<std::byte>& out, uint64_t value, int bytes) {
  for (int b = bytes - 1; b >= 0; --b)
    out.push_back(std::byte(static_cast<uint8_t>(value >> (8 * b))));
}

// The HDF5 LZ4 plugin's framing, with `block` bytes per block.
std::vector<std::byte> lz4(const std::vector<std::byte>& in, size_t block) {
  std::vector<std::byte> out;
  put_be(out, in.size(), 8);
  put_be(out, block, 4);
  for (size_t at = 0; at < in.size(); at += block) {
    const size_t n = std::min(block, in.size() - at);
    std::vector<char> compressed(static_cast<size_t>(LZ4_compressBound(static_cast<int>(n))));
    const int size =
        LZ4_compress_default(reinterpret_cast<const char*>(in.data() + at), compressed.data(),
                             static_cast<int>(n), static_cast<int>(compressed.size()));
    if (static_cast<size_t>(size) >= n) {  // stored raw, as the plugin does
      put_be(out, n, 4);
      out.insert(out.end(), in.begin() + static_cast<std::ptrdiff_t>(at),
                 in.begin() + static_cast<std::ptrdiff_t>(at + n));
    } else {
      put_be(out, static_cast<uint64_t>(size), 4);
      for (int i = 0; i < size; ++i)
        out.push_back(std::byte(static_cast<uint8_t>(compressed[static_cast<size_t>(i)])));
    }
  }
  return out;
}

const Hdf5Filter kShuffle{kHdf5FilterShuffle, {4}, "shuffle"};
const Hdf5Filter kDeflate{kHdf5FilterDeflate, {1}, "deflate"};
const Hdf5Filter kZstd{kHdf5FilterZstd, {}, "Zstandard"};
const Hdf5Filter kLz4{kHdf5FilterLz4, {}, "LZ4"};

TEST(Hdf5ChunkFiltersTest, ReversesShuffleThenDeflate) {
  const auto plain = sample_bytes(4002);  // not a multiple of 4: the tail stays in place
  const auto stored = deflate(shuffle(plain, 4));
  EXPECT_EQ(decode_chunk(stored, {kShuffle, kDeflate}, 0, plain.size(), 4), plain);
}

TEST(Hdf5ChunkFiltersTest, ShuffleDefaultsToTheElementSize) {
  const auto plain = sample_bytes(800);
  const Hdf5Filter shuffle_no_data{kHdf5FilterShuffle, {}, "shuffle"};
  EXPECT_EQ(decode_chunk(shuffle(plain, 8), {shuffle_no_data}, 0, plain.size(), 8), plain);
}

TEST(Hdf5ChunkFiltersTest, ReversesZstdAndLz4) {
  const auto plain = sample_bytes(100000);
  EXPECT_EQ(decode_chunk(zstd(plain), {kZstd}, 0, plain.size(), 1), plain);
  EXPECT_EQ(decode_chunk(lz4(plain, 4096), {kLz4}, 0, plain.size(), 1), plain);
  EXPECT_EQ(decode_chunk(lz4(shuffle(plain, 4), 1 << 20), {kShuffle, kLz4}, 0, plain.size(), 4),
            plain);
  std::vector<std::byte> random(5000);
  uint32_t state = 1;
  for (auto& b : random)
    b = std::byte(static_cast<uint8_t>((state = state * 1103515245u + 12345u) >> 24));
  EXPECT_EQ(decode_chunk(lz4(random, 1000), {kLz4}, 0, random.size(), 1), random);  // raw blocks
}

// An empty chunk's spans hold null pointers, which no copy may be given
// (the sanitizer build aborts on it).
TEST(Hdf5ChunkFiltersTest, EmptyChunksDecodeToNothing) {
  const std::vector<std::byte> none;
  EXPECT_TRUE(decode_chunk(none, {}, 0, 0, 4).empty());
  EXPECT_TRUE(decode_chunk(none, {kShuffle}, 0, 0, 4).empty());
  const Hdf5Filter bytewise{kHdf5FilterShuffle, {1}, "shuffle"};
  EXPECT_TRUE(decode_chunk(none, {bytewise}, 0, 0, 1).empty());
}

TEST(Hdf5ChunkFiltersTest, FilterMaskSkipsFilters) {
  const auto plain = sample_bytes(1000);
  // Bit 1 set: the writer skipped deflate for this chunk; only shuffle applies.
  EXPECT_EQ(decode_chunk(shuffle(plain, 4), {kShuffle, kDeflate}, 0b10, plain.size(), 4), plain);
  EXPECT_EQ(decode_chunk(plain, {kShuffle, kDeflate}, 0b11, plain.size(), 4), plain);
}

TEST(Hdf5ChunkFiltersTest, CorruptChunksAreFormatErrorsNamingTheFilter) {
  const auto plain = sample_bytes(4000);
  auto stored = deflate(plain);
  auto expect_format_error = [&](const std::vector<std::byte>& bytes, const Hdf5Filter& filter,
                                 const char* needle) {
    try {
      decode_chunk(bytes, {filter}, 0, plain.size(), 1);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto flipped = stored;
  flipped[stored.size() / 2] ^= std::byte{0x55};
  flipped[stored.size() / 2 + 1] ^= std::byte{0xAA};
  expect_format_error(flipped, kDeflate, "deflate");
  expect_format_error({stored.begin(), stored.begin() + 10}, kDeflate, "deflate");
  // A stream that decodes to more than the chunk.
  const auto bigger = deflate(sample_bytes(5000));
  expect_format_error(bigger, kDeflate, "past the expected");
  auto z = zstd(plain);
  z.resize(z.size() - 3);
  expect_format_error(z, kZstd, "Zstandard");
  auto l = lz4(plain, 1024);
  expect_format_error({l.begin(), l.begin() + 20}, kLz4, "LZ4");
  auto wrong_size = l;
  wrong_size[7] = std::byte{1};  // header's original size no longer matches
  expect_format_error(wrong_size, kLz4, "header says");
  expect_format_error(sample_bytes(3999), {kHdf5FilterShuffle, {4}, "shuffle"}, "shuffle");
}

TEST(Hdf5ChunkFiltersTest, UnknownFilterIsInvalidArgument) {
  const Hdf5Filter bzip2{307, {}, "bzip2"};
  EXPECT_FALSE(hdf5_filter_supported(307));
  EXPECT_THROW(decode_chunk(sample_bytes(10), {bzip2}, 0, 10, 1), InvalidArgument);
}

TEST(Hdf5ChunkFiltersTest, BloscChunksAsBloscWritesThem) {
  const std::vector<std::byte> chunk = sample_bytes(4000);
  for (const char* codec : {"blosclz", "lz4", "zstd", "zlib"}) {
    std::vector<std::byte> stored(chunk.size() + BLOSC_MAX_OVERHEAD);
    const int size = blosc_compress_ctx(5, BLOSC_SHUFFLE, 4, chunk.size(), chunk.data(),
                                        stored.data(), stored.size(), codec, 0, 1);
    ASSERT_GT(size, 0) << codec;
    stored.resize(static_cast<size_t>(size));
    const Hdf5Filter blosc{kHdf5FilterBlosc, {2, 2, 4, 4000, 5, 1, 1}, "blosc"};
    EXPECT_EQ(decode_chunk(stored, {blosc}, 0, chunk.size(), 4), chunk) << codec;
    EXPECT_THROW(decode_chunk(stored, {blosc}, 0, chunk.size() + 4, 4), FormatError);
    stored.resize(stored.size() / 2);
    EXPECT_THROW(decode_chunk(stored, {blosc}, 0, chunk.size(), 4), FormatError) << codec;
  }
}

TEST(Hdf5ChunkFiltersTest, LzfChunksAsLzfWritesThem) {
  const std::vector<std::byte> chunk = sample_bytes(4000);
  std::vector<std::byte> stored(chunk.size());
  const unsigned size = lzf_compress(chunk.data(), static_cast<unsigned>(chunk.size()),
                                     stored.data(), static_cast<unsigned>(stored.size()));
  ASSERT_GT(size, 0u);
  stored.resize(size);
  const Hdf5Filter lzf{kHdf5FilterLzf, {4, 261, 4000}, "lzf"};
  EXPECT_EQ(decode_chunk(stored, {lzf}, 0, chunk.size(), 4), chunk);
  EXPECT_EQ(decode_chunk(chunk, {lzf}, 1, chunk.size(), 4), chunk);  // stored as it was
  stored.resize(stored.size() - 3);
  EXPECT_THROW(decode_chunk(stored, {lzf}, 0, chunk.size(), 4), FormatError);
}

}  // namespace
}  // namespace leanloader
