// TensorCache: reading sharded caches and per-sample folders, zero-copy
// entries, clean-up after a crashed writer, verification.
#include "leanloader/cache/tensor_cache.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "leanloader/cache/cache_writer.h"
#include "leanloader/core/error.h"
#include "leanloader/io/safetensors.h"
#include "leanloader/pipeline/loader.h"
#include "leanloader/sources/subset_source.h"
#include "test_util.h"

namespace leanloader {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

Tensor ramp(float value, int64_t count) {
  auto storage = HeapStorage::allocate(static_cast<size_t>(count) * 4);
  auto* data = reinterpret_cast<float*>(storage->data());
  for (int64_t i = 0; i < count; ++i) data[i] = value + static_cast<float>(i) * 0.001f;
  return Tensor(storage, 0, DType::kF32, {count});
}

Tensor ids(int64_t value) {
  auto storage = HeapStorage::allocate(8);
  std::memcpy(storage->data(), &value, 8);
  return Tensor(storage, 0, DType::kI64, {1});
}

// Samples "k<i>": "x" = 32 floats from i, "id" = i.
void build(const std::string& cache, int count, size_t shard_bytes = 1000) {
  CacheWriterOptions options;
  options.shard_bytes = shard_bytes;
  CacheWriter writer(cache, options);
  for (int i = 0; i < count; ++i) {
    writer.add("k" + std::to_string(i), {}, {{"x", ramp(float(i), 32)}, {"id", ids(i)}});
  }
  writer.flush();
}

// Gives every field of one sample its own buffer.
class BufferWriter final : public SampleWriter {
 public:
  explicit BufferWriter(bool streaming = false) : streaming_(streaming) {}
  bool prefers_streaming_stores() const override { return streaming_; }
  std::span<std::byte> field_buffer(size_t field, const Shape& shape) override {
    if (buffers.size() <= field) buffers.resize(field + 1);
    size_t bytes = shape_numel(shape) * (field == 0 ? 4 : 8);
    buffers[field].assign(bytes, std::byte{0});
    return buffers[field];
  }
  template <typename T>
  T value(size_t field, size_t i = 0) const {
    T out;
    std::memcpy(&out, buffers[field].data() + i * sizeof(T), sizeof(T));
    return out;
  }
  std::vector<std::vector<std::byte>> buffers;

 private:
  bool streaming_;
};

TEST(TensorCacheTest, ReadsEverySampleOfAShardedCache) {
  TempDir dir;
  const std::string cache_dir = dir.file("c");
  build(cache_dir, 25);
  const auto cache = TensorCache::open(cache_dir);
  EXPECT_EQ(cache->layout(), TensorCache::Layout::kSharded);
  ASSERT_EQ(cache->size(), 25);
  EXPECT_GE(cache->manifest()->shards.size(), 4u);  // 8 samples of 136 bytes per shard
  ASSERT_EQ(cache->fields().size(), 2u);
  EXPECT_EQ(cache->fields()[0].name, "x");
  EXPECT_EQ(cache->fields()[0].dtype, DType::kF32);
  EXPECT_EQ(*cache->fields()[0].shape, (Shape{32}));
  EXPECT_EQ(cache->estimated_sample_bytes(), 32u * 4 + 8);
  for (int64_t i = 0; i < cache->size(); ++i) {
    BufferWriter writer;
    cache->read_sample(i, writer);
    const int64_t id = writer.value<int64_t>(1);
    EXPECT_EQ("k" + std::to_string(id), cache->key(i));
    EXPECT_FLOAT_EQ(writer.value<float>(0, 5), float(id) + 0.005f);
  }
  EXPECT_EQ(cache->find("k7").value_or(-1) >= 0, true);
  EXPECT_FALSE(cache->find("nope").has_value());
  EXPECT_NE(cache->sample_location(0).find(" key k"), std::string::npos);
}

// Gathers tell a read from storage from one served by the page cache, as
// NpySource's large rows do (the loader then reads ahead). Skipped where
// the shards cannot be evicted (tmpfs).
TEST(TensorCacheTest, CountsGathersThatCameFromStorage) {
  TempDir dir;
  const std::string cache_dir = dir.file("c");
  {
    CacheWriterOptions options;
    options.shard_bytes = size_t{64} << 20;
    CacheWriter writer(cache_dir, options);
    for (int i = 0; i < 8; ++i) {
      writer.add("k" + std::to_string(i), {}, {{"x", ramp(float(i), 65536)}, {"id", ids(i)}});
    }
    writer.flush();
  }
  // Evicts the shards; returns the pages still resident.
  const auto evict = [&] {
    size_t resident_pages = 0;
    for (const auto& item : fs::directory_iterator(cache_dir)) {
      if (item.path().extension() != ".safetensors") continue;
      resident_pages += testing::evict_from_page_cache(item.path().string());
    }
    return resident_pages;
  };
  const auto cache = TensorCache::open(cache_dir);
  BufferWriter writer;
  cache->read_sample(0, writer);  // opens (and checks) the shard
  // The cache's own mapping of the shard may keep pages it touched: at most
  // its header's.
  const uint64_t before = cache->storage_reads();
  uint64_t after_first = before;
  // Samples 1-7 in turn until one read counts (see
  // read_after_eviction_until_counted).
  int64_t sample = 0;
  const auto outcome = testing::read_after_eviction_until_counted(evict, 16, [&](int attempt) {
    sample = 1 + attempt % 7;
    cache->read_sample(sample, writer);  // from storage, most times
    after_first = cache->storage_reads();
    return after_first != before;
  });
  if (outcome == testing::EvictedRead::kCannotEvict) {
    GTEST_SKIP() << "the file system keeps the shards in memory (tmpfs?)";
  }
  EXPECT_GE(after_first, before + 1);
  EXPECT_FLOAT_EQ(writer.value<float>(0, 3), float(sample) + 0.003f);
  cache->will_need(6);                 // a hint: never throws, returns at once
  cache->read_sample(sample, writer);  // now in the page cache
  EXPECT_EQ(cache->storage_reads(), after_first);
}

// Into batches that want streaming stores, tensors in memory are copied from
// the shard's mapping instead of pread: the same bytes.
TEST(TensorCacheTest, StreamingGathersReadTheSameBytes) {
  TempDir dir;
  build(dir.file("c"), 25);
  const auto cache = TensorCache::open(dir.file("c"));
  for (int64_t i = 0; i < cache->size(); ++i) {
    BufferWriter cached;
    BufferWriter streamed(/*streaming=*/true);
    cache->read_sample(i, cached);
    cache->read_sample(i, streamed);
    ASSERT_EQ(cached.buffers, streamed.buffers) << i;
  }
}

TEST(TensorCacheTest, EntriesAreZeroCopyViewsOfTheMapping) {
  TempDir dir;
  build(dir.file("c"), 4);
  const auto cache = TensorCache::open(dir.file("c"));
  const auto entry = cache->entry(*cache->find("k2"));
  ASSERT_EQ(entry.size(), 2u);
  EXPECT_EQ(entry[0].first, "x");
  EXPECT_EQ(entry[0].second.storage()->kind(), StorageKind::kMapped);
  EXPECT_FLOAT_EQ(reinterpret_cast<const float*>(entry[0].second.data())[1], 2.001f);
  // Both entries of one shard view the same mapping: mapped once.
  const auto other = cache->entry(*cache->find("k3"));
  if (cache->manifest()->entries[*cache->find("k2")].shard ==
      cache->manifest()->entries[*cache->find("k3")].shard) {
    EXPECT_EQ(entry[0].second.storage(), other[0].second.storage());
  }
}

TEST(TensorCacheTest, LoaderBatchesACacheAndASubset) {
  TempDir dir;
  build(dir.file("c"), 30);
  const auto cache = TensorCache::open(dir.file("c"));
  LoaderOptions options;
  options.batch_size = 4;
  options.shuffle = true;
  options.num_threads = 8;
  Loader loader(cache, options);
  std::vector<int> seen(30, 0);
  auto it = loader.iterate();
  Batch batch;
  while (it->next(batch, std::chrono::seconds(10)) == EpochIterator::Status::kBatch) {
    const auto* id = reinterpret_cast<const int64_t*>(batch.stacked[1].data());
    const auto* x = reinterpret_cast<const float*>(batch.stacked[0].data());
    for (size_t r = 0; r < batch.indices.size(); ++r) {
      ++seen[static_cast<size_t>(id[r])];
      EXPECT_FLOAT_EQ(x[r * 32], float(id[r]));
    }
  }
  for (const int count : seen) EXPECT_EQ(count, 1);

  const auto subset = std::make_shared<SubsetSource>(cache, std::vector<int64_t>{5, 1});
  ASSERT_EQ(subset->size(), 2);
  BufferWriter writer;
  subset->read_sample(0, writer);
  EXPECT_EQ(cache->key(5), "k" + std::to_string(writer.value<int64_t>(1)));
  EXPECT_THROW(SubsetSource(cache, {30}), InvalidArgument);
}

TEST(TensorCacheTest, OpenRemovesLeftoversOfACrashedWriterOnlyWhenAlone) {
  TempDir dir;
  const std::string c = dir.file("c");
  build(c, 3);
  std::ofstream(c + "/shard-000099-dead.safetensors.tmp.1.abc") << "partial";
  std::ofstream(c + "/manifest.json.tmp.1.abc") << "{";
  // A writer's shard whose manifest never landed: marked as the writer's own.
  save_safetensors(c + "/shard-000098-beef.safetensors", {{"0/x", ramp(1, 2)}});
  std::ofstream(c + "/shard-000098-beef.safetensors.discardable");
  std::ofstream(c + "/shard-000096-gone.safetensors.discardable");  // its shard never renamed
  // A shard no writer here marked (a copy in progress): not the cache's to delete.
  save_safetensors(c + "/shard-000097-cafe.safetensors", {{"0/x", ramp(1, 2)}});
  std::ofstream(c + "/notes.txt") << "user file";
  {
    // Someone else has the cache open: nothing is removed.
    const auto first = TensorCache::open(c, /*cleanup=*/false);
    const auto second = TensorCache::open(c);
    EXPECT_TRUE(second->removed_on_open().empty());
    const auto problems = second->verify(false);
    ASSERT_EQ(problems.size(), 4u);
    std::map<std::string, int> kinds;
    for (const auto& problem : problems) ++kinds[problem.kind];
    EXPECT_EQ(kinds["partial"], 2);
    EXPECT_EQ(kinds["garbage"], 1);
    EXPECT_EQ(kinds["unreferenced"], 1);
  }
  const auto alone = TensorCache::open(c);
  EXPECT_EQ(alone->removed_on_open(),
            (std::vector<std::string>{"manifest.json.tmp.1.abc", "shard-000098-beef.safetensors",
                                      "shard-000099-dead.safetensors.tmp.1.abc"}));
  const auto problems = alone->verify(true);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_EQ(problems[0].kind, "unreferenced");
  EXPECT_TRUE(fs::exists(c + "/shard-000097-cafe.safetensors"));
  EXPECT_FALSE(fs::exists(c + "/shard-000098-beef.safetensors.discardable"));
  EXPECT_FALSE(fs::exists(c + "/shard-000096-gone.safetensors.discardable"));
  EXPECT_TRUE(fs::exists(c + "/notes.txt"));
  EXPECT_EQ(alone->size(), 3);
}

TEST(TensorCacheTest, ShardsCopiedBeforeTheirManifestAreKept) {
  // A copy of a cache whose manifest.json arrives last, opened in between,
  // is an empty cache; its shards were deleted as leftovers of a crash.
  TempDir dir;
  const std::string original = dir.file("original");
  const std::string copy = dir.file("copy");
  build(original, 6, 100);
  fs::create_directory(copy);
  for (const auto& file : fs::directory_iterator(original)) {
    const std::string name = file.path().filename().string();
    if (name.starts_with("shard-")) fs::copy_file(file.path(), copy + "/" + name);
  }
  {
    const auto early = TensorCache::open(copy);
    EXPECT_EQ(early->size(), 0);
    EXPECT_TRUE(early->removed_on_open().empty());
  }
  fs::copy_file(original + "/manifest.json", copy + "/manifest.json");
  const auto complete = TensorCache::open(copy);
  ASSERT_EQ(complete->size(), 6);
  BufferWriter writer;
  complete->read_sample(5, writer);
  EXPECT_TRUE(complete->verify(true).empty());
}

TEST(TensorCacheTest, ABuildLeavesNoMarkers) {
  TempDir dir;
  const std::string c = dir.file("c");
  build(c, 6, 100);
  build(c, 6, 100);  // every entry superseded: the first shards are marked, then removed
  const auto alone = TensorCache::open(c);
  EXPECT_FALSE(alone->removed_on_open().empty());
  for (const auto& file : fs::directory_iterator(c)) {
    EXPECT_FALSE(file.path().string().ends_with(".discardable")) << file.path();
  }
}

TEST(TensorCacheTest, ACorruptShardNamesTheShardAndKeys) {
  TempDir dir;
  const std::string c = dir.file("c");
  build(c, 6, 100000);
  const auto manifest = read_cache_manifest(c + "/manifest.json");
  const std::string shard = c + "/" + manifest.shards[0].file;
  fs::resize_file(shard, fs::file_size(shard) - 4);
  const auto cache = TensorCache::open(c);
  BufferWriter writer;
  try {
    cache->read_sample(0, writer);
    FAIL() << "read a truncated shard";
  } catch (const FormatError& error) {
    EXPECT_NE(std::string(error.what()).find(manifest.shards[0].file), std::string::npos);
  }
  const auto problems = cache->verify(false);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_EQ(problems[0].kind, "invalid");
  EXPECT_NE(problems[0].message.find("'k0'"), std::string::npos) << problems[0].message;
}

// A byte flipped inside a shard reads back as valid safetensors with other
// values: only the checksum written with each tensor tells.
TEST(TensorCacheTest, VerifyWithDataFindsAFlippedByteAndNamesItsEntry) {
  TempDir dir;
  const std::string c = dir.file("c");
  build(c, 6, 100000);
  EXPECT_TRUE(TensorCache::open(c)->verify(false, true).empty());
  const auto manifest = read_cache_manifest(c + "/manifest.json");
  const CacheTensorRecord& x_of_k4 = manifest.entries[4].tensors[0];
  ASSERT_EQ(x_of_k4.name, "x");
  ASSERT_TRUE(x_of_k4.checksum.starts_with("xxh64:")) << x_of_k4.checksum;
  {
    std::fstream shard(c + "/" + manifest.shards[0].file,
                       std::ios::in | std::ios::out | std::ios::binary);
    shard.seekp(static_cast<std::streamoff>(x_of_k4.offset + 5));
    shard.put('\x7f');
  }
  EXPECT_TRUE(TensorCache::open(c)->verify(false).empty());  // without the data: unseen
  const auto problems = TensorCache::open(c)->verify(false, true);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_EQ(problems[0].kind, "corrupt");
  EXPECT_TRUE(problems[0].where.ends_with(" key k4")) << problems[0].where;
  EXPECT_NE(problems[0].message.find("tensor 'x'"), std::string::npos) << problems[0].message;
}

TEST(TensorCacheTest, VerifyReportsStaleSources) {
  TempDir dir;
  const std::string c = dir.file("c");
  const std::string src = dir.file("img.png");
  std::ofstream(src) << "pixels";
  {
    CacheWriter writer(c);
    writer.add(src, fingerprint_file(src, false, "cfg"), {{"x", ramp(1, 4)}});
    writer.flush();
  }
  EXPECT_TRUE(TensorCache::open(c)->verify(true).empty());
  std::ofstream(src) << "new pixels!";
  const auto problems = TensorCache::open(c)->verify(true);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_EQ(problems[0].kind, "stale");
  EXPECT_NE(problems[0].where.find(src), std::string::npos);
  fs::remove(src);
  EXPECT_NE(TensorCache::open(c)->verify(true)[0].message.find("gone"), std::string::npos);
}

TEST(TensorCacheTest, ReadsAFolderOfPerSampleFiles) {
  TempDir dir;
  const std::string folder = dir.file("_latent_cache");
  fs::create_directories(folder);
  for (int i = 0; i < 5; ++i) {
    save_safetensors(folder + "/img" + std::to_string(i) + "_h.safetensors",
                     {{"latent", ramp(float(i), 16)}},
                     std::map<std::string, std::string>{{"format", "pt"}});
  }
  // A truncated file, as a trainer killed mid-write leaves it.
  std::ofstream(folder + "/img9_h.safetensors", std::ios::binary) << std::string(12, '\x01');
  // The AppleDouble file a macOS copy leaves is hidden, not a sample (it
  // sorted first and shifted every index).
  std::ofstream(folder + "/._img0_h.safetensors", std::ios::binary) << "\x00\x05\x16\x07Mac OS X";
  const auto cache = TensorCache::open(folder);
  EXPECT_EQ(cache->layout(), TensorCache::Layout::kPerSampleFiles);
  ASSERT_EQ(cache->size(), 6);
  EXPECT_EQ(cache->key(0), "img0_h");
  EXPECT_EQ(*cache->fields()[0].shape, (Shape{16}));
  BufferWriter writer;
  cache->read_sample(3, writer);
  EXPECT_FLOAT_EQ(writer.value<float>(0, 0), 3.0f);
  EXPECT_EQ(cache->entry(2)[0].second.storage()->kind(), StorageKind::kMapped);
  try {
    cache->read_sample(5, writer);
    FAIL();
  } catch (const FormatError& error) {
    EXPECT_NE(std::string(error.what()).find("img9_h.safetensors"), std::string::npos);
  }
  const auto problems = cache->verify(true);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_EQ(problems[0].kind, "invalid");
  // One file is a cache of one sample.
  const auto single = TensorCache::open(folder + "/img1_h.safetensors");
  ASSERT_EQ(single->size(), 1);
  single->read_sample(0, writer);
  EXPECT_FLOAT_EQ(writer.value<float>(0, 0), 1.0f);
}

TEST(TensorCacheTest, AnEmptyDirectoryIsAnEmptyCache) {
  TempDir dir;
  fs::create_directories(dir.file("e"));
  const auto cache = TensorCache::open(dir.file("e"));
  EXPECT_EQ(cache->size(), 0);
  EXPECT_TRUE(cache->verify().empty());
  EXPECT_THROW(TensorCache::open(dir.file("missing")), Error);
}

TEST(TensorCacheTest, ConcurrentReadersMapEachShardOnce) {
  TempDir dir;
  build(dir.file("c"), 40, 4000);
  const auto cache = TensorCache::open(dir.file("c"));
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 50; ++round) {
        const int64_t i = (t * 7 + round) % 40;
        BufferWriter writer;
        cache->read_sample(i, writer);
        if (cache->key(i) != "k" + std::to_string(writer.value<int64_t>(1))) ++bad;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(bad.load(), 0);
  const auto a = cache->entry(0)[0].second.storage();
  const auto b = cache->entry(0)[0].second.storage();
  EXPECT_EQ(a, b);
}

// Runs one epoch of `loader`; returns how often each id was seen and the
// warnings of its batches.
std::vector<int> run_epoch(Loader& loader, int max_id, std::vector<std::string>* warnings = nullptr,
                           int stop_after_batches = -1) {
  std::vector<int> seen(static_cast<size_t>(max_id), 0);
  auto it = loader.iterate();
  Batch batch;
  int batches = 0;
  while (batches != stop_after_batches &&
         it->next(batch, std::chrono::seconds(10)) == EpochIterator::Status::kBatch) {
    ++batches;
    const auto* id = reinterpret_cast<const int64_t*>(batch.stacked[1].data());
    for (size_t r = 0; r < batch.indices.size(); ++r) ++seen.at(static_cast<size_t>(id[r]));
    if (warnings != nullptr) {
      for (const Warning& warning : batch.warnings) warnings->push_back(warning.message);
    }
  }
  return seen;
}

TEST(TensorCacheSnapshotTest, ASnapshotNeverChangesUnderItsReader) {
  TempDir dir;
  const std::string c = dir.file("c");
  build(c, 10);
  const auto cache = TensorCache::open(c);
  const std::shared_ptr<const Source> before = cache->snapshot();
  const std::vector<FieldSpec>* fields = &cache->fields();
  build(c, 25);
  cache->reload();
  EXPECT_EQ(cache->size(), 25);
  EXPECT_EQ(before->size(), 10);
  EXPECT_NE(cache->snapshot(), before);
  EXPECT_EQ(cache->snapshot()->size(), 25);
  BufferWriter writer;
  before->read_sample(9, writer);
  EXPECT_EQ(writer.value<int64_t>(1), 9);
  EXPECT_THROW(before->read_sample(10, writer), InvalidArgument);
  // A field list handed out before the reload is still alive.
  EXPECT_EQ((*fields)[0].name, "x");
}

TEST(TensorCacheSnapshotTest, AShuffledLoaderOverAGrowingCacheReadsOneSnapshotPerEpoch) {
  TempDir dir;
  const std::string c = dir.file("c");
  build(c, 30);
  const auto cache = TensorCache::open(c);
  LoaderOptions options;
  options.batch_size = 4;
  options.shuffle = true;
  options.num_threads = 4;
  Loader loader(cache, options);
  EXPECT_EQ(loader.num_batches(), 8);

  // Grown in the middle of an epoch: that epoch stays on its snapshot.
  {
    auto it = loader.iterate();
    Batch batch;
    ASSERT_EQ(it->next(batch, std::chrono::seconds(10)), EpochIterator::Status::kBatch);
    build(c, 70);
    cache->reload();
    std::vector<int> seen(70, 0);
    do {
      const auto* id = reinterpret_cast<const int64_t*>(batch.stacked[1].data());
      for (size_t r = 0; r < batch.indices.size(); ++r) ++seen.at(static_cast<size_t>(id[r]));
    } while (it->next(batch, std::chrono::seconds(10)) == EpochIterator::Status::kBatch);
    for (int i = 0; i < 70; ++i) EXPECT_EQ(seen[static_cast<size_t>(i)], i < 30 ? 1 : 0) << i;
  }
  EXPECT_EQ(loader.num_batches(), 8);  // changes when the next epoch starts

  // The next epochs: the grown cache, each sample exactly once, and one
  // warning (in the first epoch that reads it).
  std::vector<std::string> warnings;
  for (int epoch = 0; epoch < 3; ++epoch) {
    const std::vector<int> seen = run_epoch(loader, 70, &warnings);
    for (int i = 0; i < 70; ++i) ASSERT_EQ(seen[static_cast<size_t>(i)], 1) << i;
  }
  EXPECT_EQ(loader.num_batches(), 18);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("from 30 to 70 samples"), std::string::npos) << warnings[0];
}

TEST(TensorCacheSnapshotTest, AResumedEpochStaysOnTheSnapshotItsStateWasCheckedAgainst) {
  TempDir dir;
  const std::string c = dir.file("c");
  build(c, 30);
  const auto cache = TensorCache::open(c);
  LoaderOptions options;
  options.batch_size = 4;
  options.shuffle = true;
  Loader first(cache, options);
  std::vector<int> seen = run_epoch(first, 70, nullptr, /*stop_after_batches=*/3);
  const LoaderState state = first.state();
  ASSERT_EQ(state.position, 12u);
  Loader second(cache, options);
  second.load_state(state);
  build(c, 70);
  cache->reload();
  // The rest of the resumed epoch: the 30-sample snapshot, no sample twice.
  std::vector<std::string> warnings;
  const std::vector<int> rest = run_epoch(second, 70, &warnings);
  for (int i = 0; i < 70; ++i) {
    EXPECT_EQ(seen[static_cast<size_t>(i)] + rest[static_cast<size_t>(i)], i < 30 ? 1 : 0) << i;
  }
  EXPECT_TRUE(warnings.empty());
  // The next epoch follows the update.
  const std::vector<int> next = run_epoch(second, 70, &warnings);
  for (int i = 0; i < 70; ++i) EXPECT_EQ(next[static_cast<size_t>(i)], 1) << i;
  EXPECT_EQ(warnings.size(), 1u);
}

TEST(TensorCacheSnapshotTest, APinnedLoaderKeepsTheSnapshotItWasMadeWith) {
  TempDir dir;
  const std::string c = dir.file("c");
  build(c, 12);
  const auto cache = TensorCache::open(c);
  LoaderOptions options;
  options.batch_size = 5;
  options.shuffle = true;
  options.follow_updates = false;
  Loader loader(cache, options);
  build(c, 40);
  cache->reload();
  std::vector<std::string> warnings;
  const std::vector<int> seen = run_epoch(loader, 40, &warnings);
  for (int i = 0; i < 40; ++i) EXPECT_EQ(seen[static_cast<size_t>(i)], i < 12 ? 1 : 0) << i;
  EXPECT_TRUE(warnings.empty());
  EXPECT_EQ(loader.num_batches(), 3);
  EXPECT_EQ(loader.snapshot().size(), 12);
}

TEST(TensorCacheSnapshotTest, FieldsThatNoLongerFitThePlannedSlotsAreAnError) {
  TempDir dir;
  const std::string c = dir.file("c");
  build(c, 6);
  const auto cache = TensorCache::open(c);
  LoaderOptions options;
  options.batch_size = 2;
  Loader loader(cache, options);
  options.follow_updates = false;
  Loader pinned(cache, options);
  {
    CacheWriter writer(c, CacheWriterOptions{});
    writer.add("longer", {}, {{"x", ramp(1, 64)}, {"id", ids(6)}});
    writer.flush();
  }
  cache->reload();
  EXPECT_FALSE(cache->fields()[0].shape.has_value());
  try {
    loader.iterate();
    FAIL() << "no error";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("fields changed"), std::string::npos) << error.what();
  }
  // A pinned Loader still reads the snapshot it was made with.
  const std::vector<int> seen = run_epoch(pinned, 7);
  for (int i = 0; i < 7; ++i) EXPECT_EQ(seen[static_cast<size_t>(i)], i < 6 ? 1 : 0) << i;
}

TEST(TensorCacheSnapshotTest, ALiveSnapshotKeepsItsShardsFromCleanUp) {
  TempDir dir;
  const std::string c = dir.file("c");
  build(c, 4, 1 << 20);
  std::shared_ptr<const Source> snapshot = TensorCache::open(c)->snapshot();  // cache gone
  std::vector<std::string> shards_before;
  for (const auto& file : fs::directory_iterator(c)) {
    if (file.path().extension() == ".safetensors") shards_before.push_back(file.path().string());
  }
  ASSERT_EQ(shards_before.size(), 1u);
  build(c, 4, 1 << 20);  // every entry rewritten: no manifest references the old shard
  {
    // Another opener (in this process: flock conflicts between open file
    // descriptions as between processes) finds the cache in use.
    const auto other = TensorCache::open(c);
    EXPECT_TRUE(other->removed_on_open().empty());
  }
  ASSERT_TRUE(fs::exists(shards_before[0]));
  BufferWriter writer;
  snapshot->read_sample(3, writer);  // maps the old shard only now
  EXPECT_EQ(writer.value<int64_t>(1), 3);
  snapshot.reset();
  const auto alone = TensorCache::open(c);
  ASSERT_EQ(alone->removed_on_open().size(), 1u);
  EXPECT_FALSE(fs::exists(shards_before[0]));
}

TEST(TensorCacheSnapshotTest, ALockFileThatCannotBeOpenedForWritingIsAnError) {
  TempDir dir;
  const std::string c = dir.file("c");
  build(c, 2);
  fs::remove(c + "/.lock");
  fs::create_directory(c + "/.lock");  // open(O_RDWR) fails with EISDIR, even as root
  try {
    TensorCache::open(c);
    FAIL() << "no error";
  } catch (const IoError& error) {
    EXPECT_NE(std::string(error.what()).find(".lock"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace leanloader
