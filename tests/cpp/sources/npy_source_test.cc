#include "leanloader/sources/npy_source.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "leanloader/core/error.h"
#include "leanloader/io/npy_format.h"
#include "test_util.h"

namespace leanloader {
namespace {

using testing::TempDir;
using testing::write_npy;

// Collects one sample into owned buffers.
class CollectingWriter final : public SampleWriter {
 public:
  explicit CollectingWriter(const Source& source, bool streaming = false)
      : source_(source), streaming_(streaming) {}
  bool prefers_streaming_stores() const override { return streaming_; }
  std::span<std::byte> field_buffer(size_t field, const Shape& shape) override {
    if (buffers.size() <= field) {
      buffers.resize(field + 1);
      shapes.resize(field + 1);
    }
    shapes[field] = shape;
    buffers[field].resize(shape_numel(shape) * dtype_size(source_.fields()[field].dtype));
    return {buffers[field].data(), buffers[field].size()};
  }
  const Source& source_;
  const bool streaming_;
  std::vector<std::vector<std::byte>> buffers;
  std::vector<Shape> shapes;
};

std::span<const std::byte> as_bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

TEST(NpyFormatTest, ParsesNumpyHeaders) {
  const std::string dict =
      "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }" + std::string(10, ' ') + "\n";
  std::string header = std::string("\x93NUMPY\x01\x00", 8);
  header += static_cast<char>(dict.size());
  header += '\0';
  header += dict;
  const NpyHeader parsed = parse_npy_header(as_bytes(header), "x.npy");
  EXPECT_EQ(parsed.dtype, DType::kF32);
  EXPECT_EQ(parsed.shape, (Shape{3, 4}));
  EXPECT_FALSE(parsed.fortran_order);
  EXPECT_EQ(parsed.data_offset, header.size());
}

TEST(NpyFormatTest, RejectsMalformedHeadersNamingTheFile) {
  const auto header_with = [](const std::string& dict) {
    std::string h = std::string("\x93NUMPY\x01\x00", 8);
    h += static_cast<char>(dict.size());
    h += '\0';
    return h + dict;
  };
  const std::vector<std::string> bad = {
      "not numpy at all",
      header_with("{'descr': '>f4', 'fortran_order': False, 'shape': (3,), }"),
      header_with("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (3,), }"),
      header_with("{'descr': '<f4', 'shape': (3,), }"),
      header_with("{'descr': '<f4', 'fortran_order': False, 'shape': (-3,), }"),
      header_with("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), 'x': 1}"),
      header_with("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }"),
      // "(6)" is Python's number 6, not a tuple: numpy refuses it.
      header_with("{'descr': '<f4', 'fortran_order': False, 'shape': (6), }"),
      std::string("\x93NUMPY\x01\x00\xff\xff", 10),
  };
  for (const std::string& bytes : bad) {
    try {
      parse_npy_header(as_bytes(bytes), "/data/bad.npy");
      ADD_FAILURE() << "accepted: " << bytes;
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find("/data/bad.npy"), std::string::npos) << e.what();
    }
  }
  // A structured dtype is a valid header of something that is not a tensor: said so.
  const std::string records = header_with(
      "{'descr': [('a', '<f4'), ('b', '<i4')], 'fortran_order': False, 'shape': (3,), }");
  try {
    parse_npy_header(as_bytes(records), "/data/records.npy");
    ADD_FAILURE() << "accepted a structured dtype";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("'/data/records.npy': a structured dtype"),
              std::string::npos)
        << e.what();
  }
}

TEST(NpySourceTest, ReadsRowsOfMappedArrays) {
  TempDir dir;
  std::vector<float> x(5 * 3);
  std::iota(x.begin(), x.end(), 0.0f);
  std::vector<int64_t> y = {10, 11, 12, 13, 14};
  write_npy(dir.file("x.npy"), DType::kF32, {5, 3}, x);
  write_npy(dir.file("y.npy"), DType::kI64, {5}, y);
  const auto source = NpySource::from_arrays({{"x", dir.file("x.npy")}, {"y", dir.file("y.npy")}});
  ASSERT_EQ(source->size(), 5);
  ASSERT_EQ(source->fields().size(), 2u);
  EXPECT_EQ(*source->fields()[0].shape, (Shape{3}));
  EXPECT_EQ(*source->fields()[1].shape, (Shape{}));
  CollectingWriter writer(*source);
  source->read_sample(2, writer);
  const auto* row = reinterpret_cast<const float*>(writer.buffers[0].data());
  EXPECT_EQ(row[0], 6.0f);
  EXPECT_EQ(row[2], 8.0f);
  EXPECT_EQ(*reinterpret_cast<const int64_t*>(writer.buffers[1].data()), 12);
  EXPECT_NE(source->sample_location(2).find("row 2"), std::string::npos);
}

TEST(NpySourceTest, ReadsFortranOrderedArrays) {
  TempDir dir;
  // 2x3 matrix [[0,1,2],[3,4,5]] in column-major order.
  const std::vector<float> column_major = {0, 3, 1, 4, 2, 5};
  testing::write_npy(dir.file("f.npy"), DType::kF32, {2, 3}, column_major.data(), 24, true);
  const auto source = NpySource::from_arrays({{"f", dir.file("f.npy")}});
  CollectingWriter writer(*source);
  source->read_sample(1, writer);
  const auto* row = reinterpret_cast<const float*>(writer.buffers[0].data());
  EXPECT_EQ(row[0], 3.0f);
  EXPECT_EQ(row[1], 4.0f);
  EXPECT_EQ(row[2], 5.0f);
}

TEST(NpySourceTest, TruncatedArrayFileIsAFormatError) {
  TempDir dir;
  std::vector<float> x(10);
  write_npy(dir.file("x.npy"), DType::kF32, {100}, x);  // header claims 100 floats
  try {
    NpySource::from_arrays({{"x", dir.file("x.npy")}});
    FAIL() << "accepted a truncated file";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("x.npy"), std::string::npos) << e.what();
  }
}

// numpy refuses such a shape ("array is too big"): its non-zero dimensions
// overflow even though it holds no element, and the strides multiply them.
TEST(NpySourceTest, AnEmptyShapeWhoseOtherDimensionsOverflowIsAFormatError) {
  TempDir dir;
  testing::write_npy(dir.file("e.npy"), DType::kF64, {1LL << 40, 0, 1LL << 40}, nullptr, 0);
  try {
    NpySource::from_arrays({{"e", dir.file("e.npy")}});
    FAIL() << "accepted a shape whose strides overflow";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("overflows"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("e.npy"), std::string::npos) << e.what();
  }
}

// Small rows are copied from a mapping of the file; a file truncated after
// the source opened it raises SIGBUS on those pages, which must come back as
// an error naming the file and the row, never kill the process. Large rows
// (pread) report the same truncation as a short read.
TEST(NpySourceTest, FileTruncatedWhileOpenIsAnErrorNotACrash) {
  for (const int64_t row_values : {int64_t{1024}, int64_t{65536}}) {  // 4 KiB, 256 KiB rows
    TempDir dir;
    const int64_t rows = 16;
    std::vector<float> x(static_cast<size_t>(rows * row_values));
    std::iota(x.begin(), x.end(), 0.0f);
    for (const bool streaming : {false, true}) {
      write_npy(dir.file("x.npy"), DType::kF32, {rows, row_values}, x);
      const auto source = NpySource::from_arrays({{"x", dir.file("x.npy")}});
      CollectingWriter writer(*source, streaming);
      source->read_sample(rows - 1, writer);
      EXPECT_EQ(reinterpret_cast<const float*>(writer.buffers[0].data())[0],
                static_cast<float>((rows - 1) * row_values));
      // Keep the header (128 bytes) and the first two rows.
      const auto kept = static_cast<off_t>(128 + 2 * row_values * 4 + 100);
      ASSERT_EQ(::truncate(dir.file("x.npy").c_str(), kept), 0);
      try {
        source->read_sample(rows - 2, writer);
        FAIL() << "read a row the file no longer has";
      } catch (const FormatError& e) {
        EXPECT_NE(std::string(e.what()).find("x.npy"), std::string::npos) << e.what();
        if (row_values == 1024) {  // the mapped path (a pread would be "truncated")
          EXPECT_NE(std::string(e.what()).find("no longer in the file"), std::string::npos)
              << e.what();
        }
      }
      // rows still in the file read as before
      source->read_sample(0, writer);
      EXPECT_EQ(reinterpret_cast<const float*>(writer.buffers[0].data())[1], 1.0f);
    }
  }
}

// A file that loses only a few bytes keeps its last page mapped: the lost
// bytes read as zeros there, not SIGBUS. A row that ends in the last page is
// checked against the file's size now, in C order (copied or, with streaming
// stores, read straight from a resident mapping) and in Fortran order, whose
// rows are gathered from the whole file (a larger cut raised SIGBUS there,
// unguarded, and killed the process).
TEST(NpySourceTest, AFileThatLostItsLastBytesIsAnErrorNotZeros) {
  for (const bool fortran : {false, true}) {
    for (const off_t cut : {off_t{4}, off_t{3000}}) {
      for (const bool streaming : {false, true}) {
        TempDir dir;
        const int64_t rows = 1000, columns = 10;
        std::vector<float> x(static_cast<size_t>(rows * columns), 1.0f);
        testing::write_npy(dir.file("x.npy"), DType::kF32, {rows, columns}, x.data(),
                           x.size() * sizeof(float), fortran);
        const auto source = NpySource::from_arrays({{"x", dir.file("x.npy")}});
        CollectingWriter writer(*source, streaming);
        source->read_sample(rows - 1, writer);  // mapped while whole
        const off_t size = static_cast<off_t>(std::filesystem::file_size(dir.file("x.npy")));
        ASSERT_EQ(::truncate(dir.file("x.npy").c_str(), size - cut), 0);
        const std::string message = [&] {
          try {
            source->read_sample(rows - 1, writer);
          } catch (const FormatError& e) {
            return std::string(e.what());
          }
          return std::string("(no error)");
        }();
        EXPECT_NE(message.find("x.npy"), std::string::npos)
            << "fortran " << fortran << " cut " << cut << ": " << message;
      }
    }
  }
}

// Rows read with pread tell a read from storage from one served by the page
// cache (preadv2 with RWF_NOWAIT first): the loader announces the next rows
// while reads miss. Skipped where the file cannot be evicted (tmpfs).
TEST(NpySourceTest, CountsRowsThatCameFromStorage) {
  TempDir dir;
  const int64_t rows = 16, row_values = 65536;  // 256 KiB rows: the pread path
  std::vector<float> x(static_cast<size_t>(rows * row_values), 1.0f);
  write_npy(dir.file("x.npy"), DType::kF32, {rows, row_values}, x);
  const auto source = NpySource::from_arrays({{"x", dir.file("x.npy")}});
  CollectingWriter writer(*source);
  // Row 7 until one read of it counts (see read_after_eviction_until_counted).
  const auto outcome = testing::read_after_eviction_until_counted(
      [&] { return testing::evict_from_page_cache(dir.file("x.npy")); }, 4,
      [&](int) {
        const uint64_t before = source->storage_reads();
        source->read_sample(7, writer);
        EXPECT_LE(source->storage_reads(), before + 1);
        return source->storage_reads() == before + 1;
      });
  if (outcome == testing::EvictedRead::kCannotEvict) {
    GTEST_SKIP() << "the file system keeps the file in memory (tmpfs?)";
  }
  EXPECT_EQ(outcome, testing::EvictedRead::kCounted);
  EXPECT_EQ(reinterpret_cast<const float*>(writer.buffers[0].data())[5], 1.0f);
  const uint64_t cached = source->storage_reads();
  source->read_sample(7, writer);  // now in the page cache
  EXPECT_EQ(source->storage_reads(), cached);
}

// Into a batch that wants streaming stores, large rows in memory are copied
// from the mapping and rows not in memory are still pread (and counted, so
// the loader still announces the next rows): the same bytes either way.
TEST(NpySourceTest, StreamingLargeRowsReadTheSameBytesInMemoryOrNot) {
  TempDir dir;
  const int64_t rows = 32, row_values = 65536;  // 256 KiB rows, 8 MiB
  std::vector<float> x(static_cast<size_t>(rows * row_values));
  std::iota(x.begin(), x.end(), 0.0f);
  write_npy(dir.file("x.npy"), DType::kF32, {rows, row_values}, x);
  const auto source = NpySource::from_arrays({{"x", dir.file("x.npy")}});
  CollectingWriter writer(*source, /*streaming=*/true);
  const uint64_t before = source->storage_reads();
  const auto expect_row = [&](int64_t row) {
    source->read_sample(row, writer);
    ASSERT_EQ(std::memcmp(writer.buffers[0].data(), x.data() + row * row_values,
                          static_cast<size_t>(row_values) * 4),
              0)
        << row;
  };
  for (int64_t row = 0; row < 4; ++row) expect_row(row);
  EXPECT_EQ(source->storage_reads(), before);  // all in the page cache
  // Rows 0-3 were copied from the source's mapping, so their pages stay (a
  // pread maps nothing), with the rest of any large folio they share; the
  // last rows go, where the file system lets them (not tmpfs). A read that
  // does not wait for storage (RWF_NOWAIT) starts the device's read-ahead
  // and may find it done on a fast virtual disk, so the row then counts as
  // cached (as in CountsRowsThatCameFromStorage): row 28 is evicted and read
  // until one read counts (five attempts ran out in a clean-clone run).
  size_t resident = 0;
  const testing::EvictedRead outcome = testing::read_after_eviction_until_counted(
      [&] { return resident = testing::evict_from_page_cache(dir.file("x.npy")); }, 16 * 64,
      [&](int) {
        const uint64_t reads = source->storage_reads();
        expect_row(28);
        EXPECT_LE(source->storage_reads(), reads + 1);
        return source->storage_reads() == reads + 1;  // row 28: pread from storage
      });
  if (outcome == testing::EvictedRead::kCannotEvict) {
    GTEST_SKIP() << resident << " pages stayed: the file system keeps the file in memory (tmpfs?)";
  }
  ASSERT_GE(resident, size_t{4 * 64}) << "rows in memory were not copied from the mapping";
  EXPECT_EQ(outcome, testing::EvictedRead::kCounted);
  const uint64_t after_row_28 = source->storage_reads();
  expect_row(2);
  EXPECT_EQ(source->storage_reads(), after_row_28);  // row 2 stayed in memory
}

// in_memory tells whether a row's pages are in the page cache (mincore on
// the source's mapping). Skipped where the file cannot be evicted (tmpfs).
TEST(NpySourceTest, TellsWhetherARowIsInMemory) {
  TempDir dir;
  const int64_t rows = 64, row_values = 1024;  // 4 KiB rows: copied from the mapping
  std::vector<float> x(static_cast<size_t>(rows * row_values), 2.0f);
  write_npy(dir.file("x.npy"), DType::kF32, {rows, row_values}, x);
  const auto source = NpySource::from_arrays({{"x", dir.file("x.npy")}});
  EXPECT_TRUE(source->in_memory(40));  // just written
  EXPECT_TRUE(source->in_memory(-1));  // out of range: not told
  if (testing::evict_from_page_cache(dir.file("x.npy")) > 4) {
    GTEST_SKIP() << "the file system keeps the file in memory (tmpfs?)";
  }
  EXPECT_FALSE(source->in_memory(40));
  CollectingWriter writer(*source);
  source->read_sample(40, writer);
  EXPECT_TRUE(source->in_memory(40));
  EXPECT_EQ(reinterpret_cast<const float*>(writer.buffers[0].data())[7], 2.0f);
}

TEST(NpySourceTest, MissingFileIsNotFound) {
  try {
    NpySource::from_arrays({{"x", "/nonexistent/x.npy"}});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kNotFound);
  }
}

TEST(NpySourceTest, DirectoryOfPerSampleFiles) {
  TempDir dir;
  for (int i = 0; i < 3; ++i) {
    std::vector<int32_t> values(4, i);
    write_npy(dir.file("s" + std::to_string(i) + ".npy"), DType::kI32, {2, 2}, values);
  }
  const auto source = NpySource::from_directory("latent", dir.path());
  ASSERT_EQ(source->size(), 3);
  EXPECT_EQ(source->fields()[0].name, "latent");
  CollectingWriter writer(*source);
  source->read_sample(2, writer);
  EXPECT_EQ(writer.shapes[0], (Shape{2, 2}));
  EXPECT_EQ(reinterpret_cast<const int32_t*>(writer.buffers[0].data())[3], 2);
  EXPECT_EQ(source->sample_location(1), dir.file("s1.npy"));
}

TEST(NpySourceTest, PerSampleFilesInFortranOrderAreReadAsNumpyReadsThem) {
  // np.save of a transposed array (and MATLAB's and Julia's writers) store
  // fortran_order: True; such files were refused when their sample was read.
  // Sample 0 in C order, sample 1 in Fortran order; both hold the 2x3x2
  // array whose C-order elements are 100 * sample + 0..11.
  TempDir dir;
  std::vector<float> row_major(12), column_major(12);
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 3; ++j) {
      for (int k = 0; k < 2; ++k) {
        row_major[6 * i + 2 * j + k] = static_cast<float>(6 * i + 2 * j + k);
        column_major[i + 2 * j + 6 * k] = static_cast<float>(100 + 6 * i + 2 * j + k);
      }
    }
  }
  testing::write_npy(dir.file("s0.npy"), DType::kF32, {2, 3, 2}, row_major.data(), 48, false);
  testing::write_npy(dir.file("s1.npy"), DType::kF32, {2, 3, 2}, column_major.data(), 48, true);
  const auto source = NpySource::from_directory("x", dir.path());
  for (int64_t sample = 0; sample < 2; ++sample) {
    CollectingWriter writer(*source);
    source->read_sample(sample, writer);
    ASSERT_EQ(writer.shapes[0], (Shape{2, 3, 2}));
    const auto* values = reinterpret_cast<const float*>(writer.buffers[0].data());
    for (int i = 0; i < 12; ++i)
      EXPECT_EQ(values[i], static_cast<float>(100 * sample + i)) << sample << " " << i;
  }
}

TEST(NpySourceTest, HiddenFilesOfADirectoryAreNotSamples) {
  // As glob("dir/*.npy") lists it: a hidden backup and the AppleDouble file a
  // macOS copy leaves (not a .npy at all) sort first, and were read as samples.
  TempDir dir;
  for (int i = 0; i < 2; ++i) {
    write_npy(dir.file("s" + std::to_string(i) + ".npy"), DType::kI32, {2},
              std::vector<int32_t>(2, i));
  }
  write_npy(dir.file(".s0.backup.npy"), DType::kI32, {2}, std::vector<int32_t>(2, 99));
  std::ofstream(dir.file("._s1.npy"), std::ios::binary) << "\x00\x05\x16\x07Mac OS X";
  const auto source = NpySource::from_directory("x", dir.path());
  ASSERT_EQ(source->size(), 2);
  EXPECT_EQ(source->sample_location(0), dir.file("s0.npy"));
  EXPECT_EQ(source->sample_location(1), dir.file("s1.npy"));
}

}  // namespace
}  // namespace leanloader
