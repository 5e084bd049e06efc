// CacheWriter, the manifest and content hashes: publishing, replacement,
// rank parts and their merge, the manifest parser's rules.
#include "leanloader/cache/cache_writer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "leanloader/cache/cache_manifest.h"
#include "leanloader/core/error.h"
#include "leanloader/io/content_hash.h"
#include "test_util.h"

namespace leanloader {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

std::span<const std::byte> bytes_of(const std::string& text) {
  return std::as_bytes(std::span(text.data(), text.size()));
}

// A float32 tensor of `count` values all equal to `value`.
Tensor filled(float value, int64_t count) {
  auto storage = HeapStorage::allocate(static_cast<size_t>(count) * 4);
  auto* data = reinterpret_cast<float*>(storage->data());
  for (int64_t i = 0; i < count; ++i) data[i] = value;
  return Tensor(storage, 0, DType::kF32, {count});
}

SourceFingerprint config_only(const std::string& config) {
  SourceFingerprint fp;
  fp.config = config;
  return fp;
}

TEST(ContentHashTest, MatchesReferenceXxh64Vectors) {
  EXPECT_EQ(xxh64(bytes_of("")), 0xEF46DB3751D8E999ULL);
  EXPECT_EQ(xxh64(bytes_of("a")), 0xD24EC4F1A98C6E5BULL);
  EXPECT_EQ(xxh64(bytes_of("abc")), 0x44BC2CF5AD770999ULL);
  EXPECT_EQ(xxh64(bytes_of("Nobody inspects the spammish repetition")), 0xFBCEA83C8A378BF1ULL);
}

TEST(ContentHashTest, IncrementalEqualsOneShot) {
  std::string text;
  for (int i = 0; i < 1000; ++i) text += static_cast<char>(i * 7);
  Xxh64 hasher;
  for (size_t pos = 0; pos < text.size(); pos += 13) {
    hasher.update(bytes_of(text.substr(pos, 13)));
  }
  EXPECT_EQ(hasher.digest(), xxh64(bytes_of(text)));
  TempDir dir;
  std::ofstream(dir.file("f"), std::ios::binary) << text;
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx",
                static_cast<unsigned long long>(xxh64(bytes_of(text))));
  EXPECT_EQ(content_hash_file(dir.file("f")), std::string("xxh64:") + hex);
}

TEST(CacheManifestTest, RoundTripsThroughText) {
  CacheManifest manifest;
  manifest.shards.push_back({"shard-000001-abcd.safetensors", 4096});
  CacheEntry entry;
  entry.key = "img/\"odd\" key\n";
  entry.slot = 3;
  entry.fingerprint = {"/data/x.png", 123, -5, "xxh64:0123456789abcdef", "sha256:ff"};
  entry.tensors.push_back({"latent", DType::kF16, {2, 3}, 128, 12, "xxh64:0123456789abcdef"});
  manifest.entries.push_back(entry);
  const CacheManifest again =
      parse_cache_manifest(format_cache_manifest(manifest), "/c/manifest.json");
  ASSERT_EQ(again.entries.size(), 1u);
  EXPECT_EQ(again.shards[0].file, manifest.shards[0].file);
  EXPECT_EQ(again.entries[0].key, entry.key);
  EXPECT_EQ(again.entries[0].fingerprint, entry.fingerprint);
  EXPECT_EQ(again.entries[0].tensors[0].shape, (Shape{2, 3}));
  EXPECT_EQ(again.entries[0].tensors[0].offset, 128u);
  EXPECT_EQ(again.entries[0].tensors[0].checksum, "xxh64:0123456789abcdef");
}

void expect_rejected(const std::string& text, const std::string& fragment) {
  try {
    parse_cache_manifest(text, "/c/manifest.json");
    FAIL() << "accepted: " << text;
  } catch (const FormatError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("/c/manifest.json"), std::string::npos) << message;
    EXPECT_NE(message.find(fragment), std::string::npos) << message;
  }
}

TEST(CacheManifestTest, RejectsWhatReadersCannotTrust) {
  const std::string head = R"({"format":"leanloader-tensor-cache","version":1,"shards":[)";
  const std::string shard = R"({"file":"shard-1.safetensors","bytes":100})";
  auto entry = [](const std::string& key, const std::string& shard_index,
                  const std::string& tensor) {
    return R"({"key":")" + key + R"(","shard":)" + shard_index +
           R"(,"slot":0,"fingerprint":{"path":"","size":0,"mtime_ns":0,"content_hash":"","config":""},"tensors":[)" +
           tensor + "]}";
  };
  const std::string good_tensor = R"({"name":"x","dtype":"F32","shape":[2],"offset":8,"nbytes":8})";
  // The good one parses.
  EXPECT_NO_THROW(parse_cache_manifest(
      head + shard + R"(],"entries":[)" + entry("a", "0", good_tensor) + "]}", "m"));
  expect_rejected(
      head + shard + R"(],"entries":[)" +
          entry("a", "0", R"({"name":"x","dtype":"C128","shape":[2],"offset":8,"nbytes":32})") +
          "]}",
      "unknown dtype 'C128'");
  expect_rejected("{", "not valid JSON");
  expect_rejected(R"({"format":"other","version":1,"shards":[],"entries":[]})", "format");
  expect_rejected(R"({"format":"leanloader-tensor-cache","version":9,"shards":[],"entries":[]})",
                  "version 9");
  expect_rejected(head + R"({"file":"../etc.safetensors","bytes":1}],"entries":[]})",
                  "plain *.safetensors");
  expect_rejected(head + R"({"file":"a/b.safetensors","bytes":1}],"entries":[]})",
                  "plain *.safetensors");
  expect_rejected(head + shard + "," + shard + R"(],"entries":[]})", "listed twice");
  expect_rejected(head + shard + R"(],"entries":[)" + entry("a", "1", good_tensor) + "]}",
                  "does not exist");
  expect_rejected(head + shard + R"(],"entries":[)" + entry("a", "0", good_tensor) + "," +
                      entry("a", "0", good_tensor) + "]}",
                  "appears twice");
  expect_rejected(
      head + shard + R"(],"entries":[)" +
          entry("a", "0", R"({"name":"x","dtype":"F32","shape":[3],"offset":8,"nbytes":8})") + "]}",
      "nbytes 8");
  expect_rejected(
      head + shard + R"(],"entries":[)" +
          entry("a", "0", R"({"name":"x","dtype":"F32","shape":[2],"offset":96,"nbytes":8})") +
          "]}",
      "past the end");
  expect_rejected(
      head + shard + R"(],"entries":[)" +
          entry("a", "0", R"({"name":"x","dtype":"Q7","shape":[2],"offset":8,"nbytes":8})") + "]}",
      "unknown dtype");
  expect_rejected(head + shard + R"(],"entries":[],"extra":1})", "unknown member");
}

TEST(CacheWriterTest, PublishesShardsAtTheTargetSizeAndTheManifestAfterThem) {
  TempDir dir;
  const std::string cache = dir.file("cache");
  CacheWriterOptions options;
  options.shard_bytes = 3 * 64 * 4;  // three samples per shard
  CacheWriter writer(cache, options);
  for (int i = 0; i < 7; ++i) {
    writer.add("k" + std::to_string(i), config_only("c1"), {{"x", filled(float(i), 64)}});
  }
  EXPECT_EQ(writer.shards_published(), 2u);
  EXPECT_EQ(writer.pending_samples(), 1u);
  const CacheManifest on_disk = read_cache_manifest(cache + "/manifest.json");
  EXPECT_EQ(on_disk.entries.size(), 6u);  // the 7th is not published yet
  writer.flush();
  const CacheManifest final_manifest = read_cache_manifest(cache + "/manifest.json");
  EXPECT_EQ(final_manifest.entries.size(), 7u);
  EXPECT_EQ(final_manifest.shards.size(), 3u);
  EXPECT_TRUE(writer.is_fresh("k3", config_only("c1")));
  EXPECT_FALSE(writer.is_fresh("k3", config_only("c2")));
  EXPECT_FALSE(writer.is_fresh("k9", config_only("c1")));
  for (const auto& entry : fs::directory_iterator(cache)) {
    EXPECT_EQ(entry.path().filename().string().find(".tmp."), std::string::npos);
  }
}

TEST(CacheWriterTest, RejectsEntriesWithOtherNamesOrDtypes) {
  TempDir dir;
  CacheWriter writer(dir.file("c"));
  writer.add("a", {}, {{"x", filled(1, 4)}});
  EXPECT_THROW(writer.add("b", {}, {{"y", filled(1, 4)}}), InvalidArgument);
  auto storage = HeapStorage::allocate(8);
  EXPECT_THROW(writer.add("b", {}, {{"x", Tensor(storage, 0, DType::kI64, {1})}}), InvalidArgument);
  EXPECT_THROW(writer.add("b", {}, {}), InvalidArgument);
  // complex128 has no safetensors dtype: refused at add(), naming the entry
  // (it had failed at the shard's write, naming the shard's tensor).
  CacheWriter wide_writer(dir.file("wide"));
  try {
    wide_writer.add("k0", {}, {{"z", Tensor(HeapStorage::allocate(32), 0, DType::kC128, {2})}});
    ADD_FAILURE() << "complex128 accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("cache entry 'k0': tensor 'z' is C128"), std::string::npos)
        << e.what();
  }
  // Another shape is fine.
  EXPECT_NO_THROW(writer.add("b", {}, {{"x", filled(1, 9)}}));
}

TEST(CacheWriterTest, ReplacingEveryEntryOfAShardDropsTheShard) {
  TempDir dir;
  const std::string cache = dir.file("c");
  {
    CacheWriter writer(cache);
    writer.add("a", config_only("1"), {{"x", filled(1, 4)}});
    writer.flush();
  }
  {
    CacheWriter writer(cache);
    EXPECT_TRUE(writer.is_fresh("a", config_only("1")));
    writer.add("a", config_only("2"), {{"x", filled(2, 4)}});
    writer.flush();
    EXPECT_EQ(writer.manifest().shards.size(), 1u);
    EXPECT_TRUE(writer.is_fresh("a", config_only("2")));
  }
  // The superseded shard is an orphan; the next writer (nobody else has the
  // cache open) removes it.
  size_t shards = 0;
  { CacheWriter writer(cache); }
  for (const auto& entry : fs::directory_iterator(cache)) {
    shards += entry.path().filename().string().starts_with("shard-") ? 1 : 0;
  }
  EXPECT_EQ(shards, 1u);
}

TEST(CacheWriterTest, RankPartsMergeIntoTheManifest) {
  TempDir dir;
  const std::string cache = dir.file("c");
  for (int rank = 0; rank < 2; ++rank) {
    CacheWriterOptions options;
    options.rank = rank;
    CacheWriter writer(cache, options);
    for (int i = rank; i < 6; i += 2) {
      writer.add("k" + std::to_string(i), {}, {{"x", filled(float(i), 8)}});
    }
    writer.flush();
  }
  EXPECT_TRUE(fs::exists(cache + "/manifest.rank0.json"));
  EXPECT_FALSE(fs::exists(cache + "/manifest.json"));
  EXPECT_EQ(merge_cache_rank_manifests(cache), 2u);
  EXPECT_FALSE(fs::exists(cache + "/manifest.rank1.json"));
  const CacheManifest merged = read_cache_manifest(cache + "/manifest.json");
  EXPECT_EQ(merged.entries.size(), 6u);
  EXPECT_EQ(merged.shards.size(), 2u);
  EXPECT_EQ(merge_cache_rank_manifests(cache), 0u);
}

TEST(CacheWriterTest, FingerprintOfAFileChangesWhenTouchedOrRewritten) {
  TempDir dir;
  const std::string path = dir.file("src.bin");
  std::ofstream(path) << "hello";
  const SourceFingerprint before = fingerprint_file(path, false, "c");
  const SourceFingerprint hashed = fingerprint_file(path, true, "c");
  EXPECT_TRUE(fingerprint_matches(before, fingerprint_file(path, false, "c")));
  EXPECT_FALSE(fingerprint_matches(before, fingerprint_file(path, false, "other config")));
  // Touch: same bytes, a new mtime.
  const auto later = fs::last_write_time(path) + std::chrono::seconds(5);
  fs::last_write_time(path, later);
  EXPECT_FALSE(fingerprint_matches(before, fingerprint_file(path, false, "c")));
  // With a content hash, a touch alone keeps the entry fresh; new bytes do not.
  EXPECT_TRUE(fingerprint_matches(hashed, fingerprint_file(path, true, "c")));
  std::ofstream(path) << "hellp";
  EXPECT_FALSE(fingerprint_matches(hashed, fingerprint_file(path, true, "c")));
}

// A relative path named another file from another working directory: two
// copies of a dataset with equal sizes and mtimes (rsync -a, tar) were the
// same source. The path is stored absolute; a relative one stored before
// matches where it resolves to the same name, as it did.
TEST(CacheWriterTest, AFingerprintNamesItsFileWhateverTheWorkingDirectory) {
  TempDir dir;
  for (const char* copy : {"a", "b"}) {
    fs::create_directories(dir.file(copy) + "/data");
    std::ofstream(dir.file(copy) + "/data/x.bin") << (copy[0] == 'a' ? "first" : "other");
  }
  fs::last_write_time(dir.file("b") + "/data/x.bin",
                      fs::last_write_time(dir.file("a") + "/data/x.bin"));
  const fs::path was = fs::current_path();
  fs::current_path(dir.file("a"));
  const SourceFingerprint in_a = fingerprint_file("data/x.bin", false, "c");
  fs::current_path(dir.file("b"));
  const SourceFingerprint in_b = fingerprint_file("./data/x.bin", false, "c");
  fs::current_path(was);
  EXPECT_EQ(in_a.path, dir.file("a") + "/data/x.bin");
  EXPECT_EQ(in_b.path, dir.file("b") + "/data/x.bin");
  EXPECT_EQ(in_a.size, in_b.size);
  EXPECT_EQ(in_a.mtime_ns, in_b.mtime_ns);
  EXPECT_FALSE(fingerprint_matches(in_a, in_b));
  SourceFingerprint stored_relative = in_a;  // as earlier versions stored it
  stored_relative.path = "data/x.bin";
  EXPECT_TRUE(fingerprint_matches(stored_relative, in_a));
  stored_relative.path = "./data/x.bin";
  EXPECT_TRUE(fingerprint_matches(stored_relative, in_b));
  stored_relative.path = "a/x.bin";
  EXPECT_FALSE(fingerprint_matches(stored_relative, in_a));
  stored_relative.path = "x.bin";
  EXPECT_TRUE(fingerprint_matches(stored_relative, in_a));
  stored_relative.path = "ta/x.bin";  // not a whole path component
  EXPECT_FALSE(fingerprint_matches(stored_relative, in_a));
}

}  // namespace
}  // namespace leanloader
