#include "leanloader/hdf5/hdf5_source.h"

#include <gtest/gtest.h>
#include <hdf5.h>
#include <sys/wait.h>
#include <unistd.h>

#include <complex>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <thread>

#include "leanloader/core/error.h"
#include "leanloader/pipeline/loader.h"
#include "test_util.h"

namespace leanloader {
namespace {

using testing::TempDir;

class CollectingWriter final : public SampleWriter {
 public:
  explicit CollectingWriter(const Source& source) : source_(source) {}
  std::span<std::byte> field_buffer(size_t field, const Shape& shape) override {
    if (buffers.size() <= field) buffers.resize(field + 1);
    buffers[field].assign(shape_numel(shape) * dtype_size(source_.fields()[field].dtype),
                          std::byte{0});
    return {buffers[field].data(), buffers[field].size()};
  }
  template <typename T>
  std::vector<T> values(size_t field) const {
    std::vector<T> out(buffers[field].size() / sizeof(T));
    std::memcpy(out.data(), buffers[field].data(), buffers[field].size());
    return out;
  }
  const Source& source_;
  std::vector<std::vector<std::byte>> buffers;
};

struct Layout {
  std::vector<hsize_t> chunk;  // empty: contiguous
  bool shuffle = false;
  int deflate = -1;
  hsize_t userblock = 0;            // bytes before the HDF5 data (MATLAB v7.3 files: 512)
  bool unfiltered_partial = false;  // H5D_CHUNK_DONT_FILTER_PARTIAL_CHUNKS
};

// Writes `values` as dataset `name` of `shape` with the HDF5 C library.
template <typename T>
void write_dataset(const std::string& path, const std::string& name, hid_t type,
                   const std::vector<hsize_t>& shape, const std::vector<T>& values,
                   const Layout& layout = {}) {
  const hid_t create = H5Pcreate(H5P_FILE_CREATE);
  if (layout.userblock != 0) H5Pset_userblock(create, layout.userblock);
  const hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, create, H5P_DEFAULT);
  H5Pclose(create);
  ASSERT_GE(file, 0);
  const hid_t space = H5Screate_simple(static_cast<int>(shape.size()), shape.data(), nullptr);
  const hid_t plist = H5Pcreate(H5P_DATASET_CREATE);
  if (!layout.chunk.empty()) {
    H5Pset_chunk(plist, static_cast<int>(layout.chunk.size()), layout.chunk.data());
    if (layout.shuffle) H5Pset_shuffle(plist);
    if (layout.deflate >= 0) H5Pset_deflate(plist, static_cast<unsigned>(layout.deflate));
    if (layout.unfiltered_partial) H5Pset_chunk_opts(plist, H5D_CHUNK_DONT_FILTER_PARTIAL_CHUNKS);
  }
  const hid_t links = H5Pcreate(H5P_LINK_CREATE);
  H5Pset_create_intermediate_group(links, 1);
  const hid_t dset = H5Dcreate2(file, name.c_str(), type, space, links, plist, H5P_DEFAULT);
  H5Pclose(links);
  ASSERT_GE(dset, 0);
  // `values` are in this machine's order whatever the file's type (big-endian ones included).
  const hid_t memory = H5Tget_native_type(type, H5T_DIR_ASCEND);
  ASSERT_GE(H5Dwrite(dset, memory, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), 0);
  H5Tclose(memory);
  H5Dclose(dset);
  H5Pclose(plist);
  H5Sclose(space);
  H5Fclose(file);
}

template <typename T>
std::vector<T> iota_values(size_t count, T start = T{}) {
  std::vector<T> out(count);
  for (size_t i = 0; i < count; ++i) out[i] = static_cast<T>(start + static_cast<T>(i % 30000));
  return out;
}

template <typename T>
std::vector<T> row_of(const std::vector<T>& values, size_t row, size_t row_elements) {
  return {values.begin() + static_cast<std::ptrdiff_t>(row * row_elements),
          values.begin() + static_cast<std::ptrdiff_t>((row + 1) * row_elements)};
}

std::string error_of(const std::function<void()>& body) {
  try {
    body();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(HDF5SourceTest, TheLoaderBillsAndBudgetsTheChunksEachThreadHolds) {
  // Chunks of 8 rows x 64 KiB, deflated: a read holds a stored chunk and a
  // decoded one (512 KiB) besides the batch, on each thread, cached or not.
  TempDir dir;
  const auto values = iota_values<float>(64 * 16384);
  write_dataset(dir.file("z.h5"), "x", H5T_NATIVE_FLOAT, {64, 16384}, values,
                {{8, 16384}, false, 1});
  HDF5SourceOptions options;
  options.chunk_cache_bytes = size_t{1} << 20;  // below 4 chunks: not cached
  const auto source = HDF5Source::open({{"x", dir.file("z.h5"), "x", std::nullopt}}, options);
  const size_t decoded = 8 * 16384 * sizeof(float);
  EXPECT_GT(source->per_thread_scratch_bytes(), decoded);
  EXPECT_LT(source->per_thread_scratch_bytes(), 2 * decoded);  // (the stored chunk compresses)
  LoaderOptions loader;
  loader.batch_size = 4;
  loader.num_threads = 3;
  loader.prefetch = 2;
  const size_t slot = 4 * 16384 * sizeof(float);
  const size_t held = options.chunk_cache_bytes + 3 * source->per_thread_scratch_bytes();
  EXPECT_EQ(Loader(source, loader).memory_bill(), 4 * slot + held);
  // A budget caps the whole bill: what the source holds leaves room for fewer slots.
  loader.memory_budget = held + 3 * slot;
  const Loader budgeted(source, loader);
  EXPECT_EQ(budgeted.num_slots(), 3u);
  EXPECT_LE(budgeted.memory_bill(), *loader.memory_budget);
  loader.memory_budget = held + slot;
  const std::string error = error_of([&] { Loader tight(source, loader); });
  EXPECT_NE(error.find("bytes per thread for 3 threads"), std::string::npos) << error;
}

TEST(HDF5SourceTest, ContiguousRowsArePreadAsWritten) {
  TempDir dir;
  const auto values = iota_values<float>(5 * 3 * 4, 0.5f);
  write_dataset(dir.file("a.h5"), "x", H5T_NATIVE_FLOAT, {5, 3, 4}, values);
  const auto source = HDF5Source::open({{"x", dir.file("a.h5"), "x", std::nullopt}});
  EXPECT_EQ(source->size(), 5);
  EXPECT_EQ(source->fields()[0].dtype, DType::kF32);
  EXPECT_EQ(*source->fields()[0].shape, (Shape{3, 4}));
  EXPECT_EQ(source->layout(0), std::vector<std::string>{"pread"});
  for (int64_t i = 0; i < 5; ++i) {
    CollectingWriter writer(*source);
    source->read_sample(i, writer);
    EXPECT_EQ(writer.values<float>(0), row_of(values, static_cast<size_t>(i), 12));
  }
}

TEST(HDF5SourceTest, ChunkedShuffleDeflateRowsAcrossChunkEdges) {
  TempDir dir;
  // Chunks (3, 4, 2) over (7, 6, 5): every axis has a partial edge chunk.
  const auto values = iota_values<int16_t>(7 * 6 * 5, int16_t{-100});
  write_dataset(dir.file("c.h5"), "g/y", H5T_NATIVE_INT16, {7, 6, 5}, values, {{3, 4, 2}, true, 4});
  const auto source = HDF5Source::open({{"y", dir.file("c.h5"), "g/y", std::nullopt}});
  EXPECT_EQ(source->layout(0), std::vector<std::string>{"chunks"});
  for (int64_t i = 6; i >= 0; --i) {
    CollectingWriter writer(*source);
    source->read_sample(i, writer);
    EXPECT_EQ(writer.values<int16_t>(0), row_of(values, static_cast<size_t>(i), 30)) << i;
  }
  EXPECT_GT(source->chunk_cache_bytes(), 0u);  // chunks of 3 rows are shared
  EXPECT_LE(source->chunk_cache_bytes(), source->chunk_cache_budget());
}

TEST(HDF5SourceTest, ConcatenatesFilesInSortedOrderAndFollowsAnIndex) {
  TempDir dir;
  const auto first = iota_values<double>(4 * 2, 0.0);
  const auto second = iota_values<double>(3 * 2, 100.0);
  write_dataset(dir.file("s2.h5"), "v", H5T_NATIVE_DOUBLE, {3, 2}, second, {{1, 2}});
  write_dataset(dir.file("s1.h5"), "v", H5T_NATIVE_DOUBLE, {4, 2}, first);
  const auto images = iota_values<uint8_t>(3 * 4, uint8_t{1});
  write_dataset(dir.file("img.h5"), "images", H5T_NATIVE_UINT8, {3, 4}, images);
  std::vector<int64_t> index = {2, 0, 1, 1, 0, 2, 2};
  const auto source = HDF5Source::open({{"v", dir.file("s*.h5"), "v", std::nullopt},
                                        {"image", dir.file("img.h5"), "images", index}});
  ASSERT_EQ(source->size(), 7);
  EXPECT_EQ(source->files(0), (std::vector<std::string>{dir.file("s1.h5"), dir.file("s2.h5")}));
  std::vector<double> all = first;
  all.insert(all.end(), second.begin(), second.end());
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int repeat = 0; repeat < 50; ++repeat) {
        for (int64_t i = 0; i < 7; ++i) {
          CollectingWriter writer(*source);
          source->read_sample(i, writer);
          if (writer.values<double>(0) != row_of(all, static_cast<size_t>(i), 2)) ++mismatches;
          if (writer.values<uint8_t>(1) !=
              row_of(images, static_cast<size_t>(index[static_cast<size_t>(i)]), 4)) {
            ++mismatches;
          }
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_NE(source->sample_location(5).find("s2.h5' dataset 'v' row 1"), std::string::npos)
      << source->sample_location(5);
}

// h5py's complex numbers (a compound {r, i} of two floats) are complex64 or
// complex128 rows.
TEST(HDF5SourceTest, H5pysComplexCompoundsAreComplex64Rows) {
  TempDir dir;
  std::vector<std::complex<float>> values(6 * 4);
  for (size_t k = 0; k < values.size(); ++k) {
    values[k] = {static_cast<float>(k) + 0.25f, -static_cast<float>(k)};
  }
  const hid_t complex64 = H5Tcreate(H5T_COMPOUND, 8);
  H5Tinsert(complex64, "r", 0, H5T_IEEE_F32BE);  // stored big-endian: read through H5Dread
  H5Tinsert(complex64, "i", 4, H5T_IEEE_F32BE);
  const hid_t little = H5Tcreate(H5T_COMPOUND, 8);
  H5Tinsert(little, "r", 0, H5T_IEEE_F32LE);
  H5Tinsert(little, "i", 4, H5T_IEEE_F32LE);
  write_dataset(dir.file("be.h5"), "x", complex64, {6, 4}, values);
  write_dataset(dir.file("le.h5"), "x", little, {6, 4}, values,
                {.chunk = {4, 3}, .shuffle = true, .deflate = 4});
  H5Tclose(complex64);
  H5Tclose(little);
  for (const char* file : {"be.h5", "le.h5"}) {
    const auto source = HDF5Source::open({{"x", dir.file(file), "x", std::nullopt}});
    EXPECT_EQ(source->fields()[0].dtype, DType::kC64) << file;
    for (int64_t i = 0; i < 6; ++i) {
      CollectingWriter writer(*source);
      source->read_sample(i, writer);
      EXPECT_EQ(writer.values<std::complex<float>>(0), row_of(values, static_cast<size_t>(i), 4))
          << file << " row " << i;
    }
  }
  const hid_t complex128 = H5Tcreate(H5T_COMPOUND, 16);
  H5Tinsert(complex128, "r", 0, H5T_NATIVE_DOUBLE);
  H5Tinsert(complex128, "i", 8, H5T_NATIVE_DOUBLE);
  const std::vector<std::complex<double>> wide{{1, 2}, {3, 4}};
  write_dataset(dir.file("c128.h5"), "x", complex128, {2}, wide);
  H5Tclose(complex128);
  const auto source = HDF5Source::open({{"x", dir.file("c128.h5"), "x", std::nullopt}});
  EXPECT_EQ(source->fields()[0].dtype, DType::kC128);
  CollectingWriter writer(*source);
  source->read_sample(1, writer);
  EXPECT_EQ(writer.values<std::complex<double>>(0), std::vector<std::complex<double>>{wide[1]});
  // Two members named otherwise are a compound h5py reads as a record: refused.
  const hid_t pair = H5Tcreate(H5T_COMPOUND, 8);
  H5Tinsert(pair, "re", 0, H5T_NATIVE_FLOAT);
  H5Tinsert(pair, "im", 4, H5T_NATIVE_FLOAT);
  write_dataset(dir.file("pair.h5"), "x", pair, {6, 4}, values);
  H5Tclose(pair);
  const std::string refused = error_of([&] {
    HDF5Source::open({{"x", dir.file("pair.h5"), "x", std::nullopt}});
  });
  EXPECT_NE(refused.find("has compound elements"), std::string::npos) << refused;
}

// Array-typed elements (PyTables' atoms with a shape) are rows with the
// array's dimensions after the dataspace's, as h5py reads them.
TEST(HDF5SourceTest, ArrayElementsAddTheirDimensionsToTheRow) {
  TempDir dir;
  const hsize_t cell[] = {3, 2};
  const hid_t little = H5Tarray_create2(H5T_IEEE_F32LE, 2, cell);
  const hid_t big = H5Tarray_create2(H5T_IEEE_F32BE, 2, cell);
  const auto values = iota_values<float>(7 * 4 * 6, -3.5f);
  write_dataset(dir.file("contiguous.h5"), "x", little, {7, 4}, values);
  // Chunks of (3, 3) cells: every row spans two chunks, the last ones partial.
  write_dataset(dir.file("chunked.h5"), "x", little, {7, 4}, values,
                {.chunk = {3, 3}, .shuffle = true, .deflate = 4});
  write_dataset(dir.file("big.h5"), "x", big, {7, 4}, values, {.chunk = {2, 4}});
  for (const auto& [file, layout] :
       {std::pair{"contiguous.h5", "pread"}, std::pair{"chunked.h5", "chunks"},
        std::pair{"big.h5", "library: big-endian F32 is converted"}}) {
    const auto source = HDF5Source::open({{"x", dir.file(file), "x", std::nullopt}});
    EXPECT_EQ(source->fields()[0].dtype, DType::kF32) << file;
    EXPECT_EQ(*source->fields()[0].shape, (Shape{4, 3, 2})) << file;
    EXPECT_EQ(source->layout(0)[0].rfind(layout, 0), 0u) << file << ": " << source->layout(0)[0];
    for (int64_t i = 6; i >= 0; --i) {
      CollectingWriter writer(*source);
      source->read_sample(i, writer);
      EXPECT_EQ(writer.values<float>(0), row_of(values, static_cast<size_t>(i), 24))
          << file << " row " << i;
    }
  }
  // An array of arrays: refused, naming it.
  const hsize_t outer[] = {2};
  const hid_t nested = H5Tarray_create2(little, 1, outer);
  write_dataset(dir.file("nested.h5"), "x", nested, {2}, iota_values<float>(2 * 2 * 6));
  const std::string refused = error_of([&] {
    HDF5Source::open({{"x", dir.file("nested.h5"), "x", std::nullopt}});
  });
  EXPECT_NE(refused.find("arrays of arrays"), std::string::npos) << refused;
  H5Tclose(nested);
  H5Tclose(little);
  H5Tclose(big);
}

TEST(HDF5SourceTest, BadInputIsAClearError) {
  TempDir dir;
  write_dataset(dir.file("a.h5"), "x", H5T_NATIVE_INT32, {4, 2}, iota_values<int32_t>(8));
  write_dataset(dir.file("b.h5"), "x", H5T_NATIVE_INT32, {4, 3}, iota_values<int32_t>(12));
  EXPECT_THROW(HDF5Source::open({{"x", dir.file("none*.h5"), "x", std::nullopt}}), IoError);
  EXPECT_NE(error_of([&] {
              HDF5Source::open({{"x", dir.file("a.h5"), "nope", std::nullopt}});
            }).find("has no dataset 'nope'"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              HDF5Source::open({{"x", dir.file("*.h5"), "x", std::nullopt}});
            }).find("has rows of"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              HDF5Source::open({{"x", dir.file("a.h5"), "x", std::vector<int64_t>{0, 4}}});
            }).find("index[1] = 4 is out of range"),
            std::string::npos);
  {
    std::ofstream junk(dir.file("junk.h5"), std::ios::binary);
    junk << "not an HDF5 file at all";
  }
  EXPECT_NE(error_of([&] {
              HDF5Source::open({{"x", dir.file("junk.h5"), "x", std::nullopt}});
            }).find("HDF5 cannot open the file"),
            std::string::npos);
  // A compound type cannot become a tensor.
  const hid_t pair = H5Tcreate(H5T_COMPOUND, 8);
  H5Tinsert(pair, "a", 0, H5T_NATIVE_INT32);
  H5Tinsert(pair, "b", 4, H5T_NATIVE_INT32);
  write_dataset(dir.file("compound.h5"), "x", pair, {4}, iota_values<int64_t>(4));
  H5Tclose(pair);
  const std::string compound = error_of([&] {
    HDF5Source::open({{"x", dir.file("compound.h5"), "x", std::nullopt}});
  });
  EXPECT_NE(compound.find("compound elements, which cannot become a tensor"), std::string::npos)
      << compound;
}

TEST(HDF5SourceTest, CorruptCompressedChunkNamesFileDatasetAndRow) {
  TempDir dir;
  const std::string path = dir.file("z.h5");
  write_dataset(path, "d", H5T_NATIVE_FLOAT, {4, 256}, iota_values<float>(4 * 256),
                {{1, 256}, false, 6});
  // Overwrite the middle of row 2's compressed chunk.
  haddr_t address = 0;
  hsize_t stored = 0;
  {
    const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    const hid_t dset = H5Dopen2(file, "d", H5P_DEFAULT);
    const hsize_t at[2] = {2, 0};
    unsigned mask = 0;
    ASSERT_GE(H5Dget_chunk_info_by_coord(dset, at, &mask, &address, &stored), 0);
    H5Dclose(dset);
    H5Fclose(file);
  }
  {
    std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(static_cast<std::streamoff>(address + stored / 2));
    const char garbage[6] = {'\x13', '\x77', '\x00', '\xff', '\x42', '\x01'};
    file.write(garbage, sizeof garbage);
  }
  const auto source = HDF5Source::open({{"d", path, "d", std::nullopt}});
  CollectingWriter writer(*source);
  EXPECT_NO_THROW(source->read_sample(1, writer));
  const std::string message = error_of([&] { source->read_sample(2, writer); });
  EXPECT_NE(message.find("'" + path + "' dataset 'd' row 2"), std::string::npos) << message;
  EXPECT_NE(message.find("deflate"), std::string::npos) << message;
}

TEST(HDF5SourceTest, AForkedChildGetsAClearError) {
  TempDir dir;
  write_dataset(dir.file("a.h5"), "x", H5T_NATIVE_INT32, {4, 2}, iota_values<int32_t>(8));
  const auto source = HDF5Source::open({{"x", dir.file("a.h5"), "x", std::nullopt}});
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    CollectingWriter writer(*source);
    try {
      source->read_sample(0, writer);
    } catch (const Error& e) {
      ::_exit(std::string(e.what()).find("forked child") != std::string::npos ? 0 : 2);
    }
    ::_exit(1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  CollectingWriter writer(*source);
  EXPECT_NO_THROW(source->read_sample(3, writer));  // the parent still reads
}

// Reads every sample of a one-field source.
template <typename T>
std::vector<T> all_rows(const HDF5Source& source) {
  std::vector<T> out;
  for (int64_t i = 0; i < source.size(); ++i) {
    CollectingWriter writer(source);
    source.read_sample(i, writer);
    const auto row = writer.values<T>(0);
    out.insert(out.end(), row.begin(), row.end());
  }
  return out;
}

TEST(HDF5SourceTest, UserBlockFilesAreReadAtTheirRealOffsets) {
  TempDir dir;
  const auto values = iota_values<int32_t>(6 * 40);
  for (const bool chunked : {false, true}) {
    for (const int deflate : {-1, 4}) {
      if (!chunked && deflate >= 0) continue;
      Layout layout;
      layout.userblock = 512;
      if (chunked) layout.chunk = {2, 40};
      layout.deflate = deflate;
      const std::string path = dir.file("ub" + std::to_string(chunked) + std::to_string(deflate));
      write_dataset(path, "x", H5T_NATIVE_INT32, {6, 40}, values, layout);
      const auto source = HDF5Source::open({{"x", path, "x", std::nullopt}});
      EXPECT_EQ(source->layout(0).front(), chunked ? "chunks" : "pread");
      EXPECT_EQ(all_rows<int32_t>(*source), values) << path;
    }
  }
}

TEST(HDF5SourceTest, UnfilteredPartialEdgeChunksAreReadAsStored) {
  TempDir dir;
  const auto values = iota_values<int16_t>(7 * 6 * 5);
  Layout layout{{3, 4, 2}, true, 4};
  layout.unfiltered_partial = true;
  write_dataset(dir.file("edge.h5"), "y", H5T_NATIVE_INT16, {7, 6, 5}, values, layout);
  const auto source = HDF5Source::open({{"y", dir.file("edge.h5"), "y", std::nullopt}});
  EXPECT_EQ(source->layout(0).front(), "chunks");
  EXPECT_EQ(all_rows<int16_t>(*source), values);
}

TEST(HDF5SourceTest, ExternalLinksAreReadFromTheFileThatHoldsTheData) {
  TempDir dir;
  const auto values = iota_values<float>(5 * 8, 1.0f);
  for (const bool chunked : {false, true}) {
    const std::string target = dir.file(chunked ? "target_c.h5" : "target.h5");
    Layout layout;
    if (chunked) layout.chunk = {1, 8};
    write_dataset(target, "data", H5T_NATIVE_FLOAT, {5, 8}, values, layout);
    const std::string linking = dir.file(chunked ? "link_c.h5" : "link.h5");
    // The linking file has a dataset of its own first, so offsets differ.
    write_dataset(linking, "padding", H5T_NATIVE_FLOAT, {64, 8}, iota_values<float>(512, 9.0f));
    const hid_t file = H5Fopen(linking.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(H5Lcreate_external(target.c_str(), "data", file, "linked", H5P_DEFAULT, H5P_DEFAULT),
              0);
    H5Fclose(file);
    const auto source = HDF5Source::open({{"x", linking, "linked", std::nullopt}});
    EXPECT_NE(source->layout(0).front().find("target"), std::string::npos)
        << source->layout(0).front();
    EXPECT_EQ(all_rows<float>(*source), values);
  }
}

TEST(HDF5SourceTest, FilesOpenOnDemandWithinTheDescriptorBudget) {
  TempDir dir;
  std::vector<int64_t> expected;
  for (int f = 0; f < 40; ++f) {
    char name[32];
    std::snprintf(name, sizeof name, "shard%03d.h5", f);
    const auto values = iota_values<int64_t>(3 * 2, int64_t{f} * 100);
    write_dataset(dir.file(name), "v", H5T_NATIVE_INT64, {3, 2}, values, {{1, 2}});
    expected.insert(expected.end(), values.begin(), values.end());
  }
  HDF5SourceOptions options;
  options.max_open_files = 16;
  const auto source = HDF5Source::open({{"v", dir.file("shard*.h5"), "v", std::nullopt}}, options);
  EXPECT_EQ(source->open_file_budget(), 16u);
  EXPECT_LE(source->open_file_count(), 16u);
  for (int pass = 0; pass < 2; ++pass) EXPECT_EQ(all_rows<int64_t>(*source), expected);
  EXPECT_LE(source->open_file_count(), 16u);
}

TEST(HDF5SourceTest, AFileReplacedUnderTheSourceIsAnError) {
  TempDir dir;
  for (int f = 0; f < 20; ++f) {
    write_dataset(dir.file("s" + std::to_string(f + 10) + ".h5"), "v", H5T_NATIVE_INT32, {2, 2},
                  iota_values<int32_t>(4), {{1, 2}});
  }
  HDF5SourceOptions options;
  options.max_open_files = 16;
  const auto source = HDF5Source::open({{"v", dir.file("s*.h5"), "v", std::nullopt}}, options);
  // s10.h5 was closed to stay within the budget; now it is another file.
  write_dataset(dir.file("s10.h5"), "v", H5T_NATIVE_INT32, {2, 2}, iota_values<int32_t>(4, 7),
                {{1, 2}});
  CollectingWriter writer(*source);
  const std::string message = error_of([&] { source->read_sample(0, writer); });
  EXPECT_NE(message.find("replaced or modified"), std::string::npos) << message;
}

// Runs the rest of a test in `directory`, and goes back however it ends.
class WorkingDirectory {
 public:
  explicit WorkingDirectory(const std::string& directory)
      : before_(std::filesystem::current_path()) {
    std::filesystem::current_path(directory);
  }
  ~WorkingDirectory() { std::filesystem::current_path(before_); }
  WorkingDirectory(const WorkingDirectory&) = delete;
  WorkingDirectory& operator=(const WorkingDirectory&) = delete;

 private:
  std::filesystem::path before_;
};

TEST(HDF5SourceTest, TheLibraryPathReadsTheFileItOpenedAfterAChangeOfDirectory) {
  TempDir dir;
  for (const char* name : {"a", "b"}) std::filesystem::create_directory(dir.file(name));
  // Big-endian: read through the library, which opens the file again by name.
  write_dataset(dir.file("a/data.h5"), "x", H5T_STD_I32BE, {4, 3}, std::vector<int32_t>(12, 1));
  write_dataset(dir.file("b/data.h5"), "x", H5T_STD_I32BE, {4, 3}, std::vector<int32_t>(12, 2));
  std::shared_ptr<HDF5Source> source;
  {
    WorkingDirectory in_a(dir.file("a"));
    source = HDF5Source::open({{"x", "data.h5", "x", std::nullopt}});
  }
  EXPECT_NE(source->layout(0).front().find("library"), std::string::npos)
      << source->layout(0).front();
  WorkingDirectory in_b(dir.file("b"));
  EXPECT_EQ(all_rows<int32_t>(*source), std::vector<int32_t>(12, 1));
}

TEST(HDF5SourceTest, AFileReplacedUnderTheLibraryPathIsAnError) {
  TempDir dir;
  write_dataset(dir.file("x.h5"), "x", H5T_STD_I32BE, {4, 3}, std::vector<int32_t>(12, 1));
  const auto source = HDF5Source::open({{"x", dir.file("x.h5"), "x", std::nullopt}});
  write_dataset(dir.file("new.h5"), "x", H5T_STD_I32BE, {4, 3}, std::vector<int32_t>(12, 2));
  std::filesystem::rename(dir.file("new.h5"), dir.file("x.h5"));
  CollectingWriter writer(*source);
  const std::string message = error_of([&] { source->read_sample(0, writer); });
  EXPECT_NE(message.find("replaced or modified"), std::string::npos) << message;
}

// A file written in place while its source is open (h5py's "r+"): chunks
// rewritten move, and decoded chunks are kept, so the next pass read the old
// rows. The pass refuses to start instead, naming the file.
// A file written since the source opened it may have moved its chunks, and
// decoded chunks are kept: the next pass reads the files opened again, as
// h5py opening them then would; a Loader keeping its snapshot stops instead.
TEST(HDF5SourceTest, AFileWrittenInPlaceIsOpenedAgainForTheNextPass) {
  TempDir dir;
  const std::string path = dir.file("w.h5");
  write_dataset(path, "x", H5T_NATIVE_FLOAT, {16, 4}, iota_values<float>(16 * 4),
                {{4, 4}, true, 4});
  const auto source = HDF5Source::open({{"x", path, "x", std::nullopt}});
  LoaderOptions options;
  options.batch_size = 16;
  options.num_threads = 2;
  Loader following(source, options);
  options.follow_updates = false;
  Loader keeping(source, options);
  // Every row of one pass, and the pass's warnings.
  auto drain = [](Loader& loader, std::vector<std::string>* warnings = nullptr) {
    auto iterator = loader.iterate();
    Batch batch;
    std::vector<float> rows;
    while (iterator->next(batch, std::chrono::seconds(10)) == EpochIterator::Status::kBatch) {
      const auto* data = reinterpret_cast<const float*>(batch.stacked[0].data());
      rows.insert(rows.end(), data, data + batch.stacked[0].numel());
      for (const Warning& warning : batch.warnings) {
        if (warnings) warnings->push_back(warning.message);
      }
    }
    return rows;
  };
  EXPECT_EQ(drain(following), iota_values<float>(16 * 4));
  EXPECT_EQ(drain(keeping), iota_values<float>(16 * 4));
  const auto rewrite = [&](float value) {
    // A later modification time (the kernel stamps at its tick: 4-10 ms).
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(file, 0);
    const hid_t dset = H5Dopen2(file, "x", H5P_DEFAULT);
    const std::vector<float> other(16 * 4, value);
    ASSERT_GE(H5Dwrite(dset, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, other.data()), 0);
    H5Dclose(dset);
    H5Fclose(file);
  };
  rewrite(7.0f);
  std::vector<std::string> warnings;
  following.set_epoch(1);
  EXPECT_EQ(drain(following, &warnings), std::vector<float>(16 * 4, 7.0f));
  EXPECT_TRUE(warnings.empty());  // same size: nothing to announce
  EXPECT_EQ(source->size(), 16);  // the source itself is as it was opened
  rewrite(8.0f);                  // written again: opened again
  following.set_epoch(2);
  EXPECT_EQ(drain(following), std::vector<float>(16 * 4, 8.0f));
  following.set_epoch(3);
  EXPECT_EQ(drain(following), std::vector<float>(16 * 4, 8.0f));  // unchanged since
  keeping.set_epoch(1);
  const std::string message = error_of([&] { drain(keeping); });
  EXPECT_NE(message.find("w.h5' was replaced or modified since the source opened it (written"),
            std::string::npos)
      << message;
}

TEST(HDF5SourceTest, AFileNamedWithGlobCharactersIsThatFile) {
  TempDir dir;
  write_dataset(dir.file("run[1].h5"), "x", H5T_NATIVE_INT32, {2, 2}, std::vector<int32_t>(4, 1));
  write_dataset(dir.file("run1.h5"), "x", H5T_NATIVE_INT32, {2, 2}, std::vector<int32_t>(4, 9));
  const auto named = HDF5Source::open({{"x", dir.file("run[1].h5"), "x", std::nullopt}});
  EXPECT_EQ(all_rows<int32_t>(*named), std::vector<int32_t>(4, 1));
  // A pattern no file is named still matches: run1.h5, then run[1].h5.
  const auto matched = HDF5Source::open({{"x", dir.file("run*.h5"), "x", std::nullopt}});
  EXPECT_EQ(all_rows<int32_t>(*matched), (std::vector<int32_t>{9, 9, 9, 9, 1, 1, 1, 1}));
}

TEST(HDF5SourceTest, LibraryErrorsGiveTheDeepestCause) {
  TempDir dir;
  const std::string path = dir.file("cut.h5");
  write_dataset(path, "x", H5T_NATIVE_INT32, {64, 64}, iota_values<int32_t>(64 * 64));
  std::filesystem::resize_file(path, 1000);
  const std::string message = error_of([&] { HDF5Source::open({{"x", path, "x", std::nullopt}}); });
  EXPECT_NE(message.find("'" + path + "'"), std::string::npos) << message;
  EXPECT_NE(message.find("truncated"), std::string::npos) << message;
}

}  // namespace
}  // namespace leanloader
