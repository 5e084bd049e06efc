#include "leanloader/hdf5/hdf5_source.h"

#include <gtest/gtest.h>
#include <hdf5.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <numeric>
#include <thread>

#include "leanloader/core/error.h"
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
};

// Writes `values` as dataset `name` of `shape` with the HDF5 C library.
template <typename T>
void write_dataset(const std::string& path, const std::string& name, hid_t type,
                   const std::vector<hsize_t>& shape, const std::vector<T>& values,
                   const Layout& layout = {}) {
  const hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(file, 0);
  const hid_t space = H5Screate_simple(static_cast<int>(shape.size()), shape.data(), nullptr);
  const hid_t plist = H5Pcreate(H5P_DATASET_CREATE);
  if (!layout.chunk.empty()) {
    H5Pset_chunk(plist, static_cast<int>(layout.chunk.size()), layout.chunk.data());
    if (layout.shuffle) H5Pset_shuffle(plist);
    if (layout.deflate >= 0) H5Pset_deflate(plist, static_cast<unsigned>(layout.deflate));
  }
  const hid_t links = H5Pcreate(H5P_LINK_CREATE);
  H5Pset_create_intermediate_group(links, 1);
  const hid_t dset = H5Dcreate2(file, name.c_str(), type, space, links, plist, H5P_DEFAULT);
  H5Pclose(links);
  ASSERT_GE(dset, 0);
  ASSERT_GE(H5Dwrite(dset, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), 0);
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

}  // namespace
}  // namespace leanloader
