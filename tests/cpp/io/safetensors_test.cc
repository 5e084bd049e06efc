#include "leanloader/io/safetensors.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "leanloader/core/checked_size.h"
#include "leanloader/core/error.h"
#include "test_util.h"

namespace leanloader {
namespace {

namespace fs = std::filesystem;

using testing::TempDir;

std::string length_prefix(uint64_t n) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>(n >> (8 * i));
  return out;
}

// A whole file: the 8-byte length of `header`, `header`, then `data`.
std::string make_file(const std::string& header, const std::string& data = "") {
  return length_prefix(header.size()) + header + data;
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

SafetensorsHeader parse(const std::string& bytes, const std::string& path = "/x/a.safetensors") {
  return parse_safetensors_header(
      std::span(reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()), bytes.size(),
      path);
}

std::string tensor_json(const std::string& name, const std::string& dtype, const std::string& shape,
                        uint64_t begin, uint64_t end) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape +
         ",\"data_offsets\":[" + std::to_string(begin) + "," + std::to_string(end) + "]}";
}

const std::string kX = tensor_json("x", "U8", "[2]", 0, 2);

struct MalformedCase {
  const char* description;
  std::string bytes;
  const char* rule;
};

std::vector<MalformedCase> malformed_cases() {
  std::string lfs_pointer = "version https://git-lfs.github.com/spec/v1\noid sha256:abc\n";
  const std::string x = tensor_json("x", "U8", "[2]", 0, 2);
  std::string deep = "{" + x.substr(0, x.size() - 1) + ",\"e\":" + std::string(200, '[') +
                     std::string(200, ']') + "}}";
  return {
      {"empty file", "", "HeaderTooSmall"},
      {"7 bytes", std::string(7, '\0'), "HeaderTooSmall"},
      {"header length over the cap", length_prefix(100'000'001) + "{}", "HeaderTooLarge"},
      {"git lfs pointer", lfs_pointer, "HeaderTooLarge"},
      {"header past end of file", length_prefix(100) + "{}", "InvalidHeaderLength"},
      {"header length 2^64-1", length_prefix(UINT64_MAX), "HeaderTooLarge"},
      {"not utf-8", make_file("{\"x\xff\":1}"), "InvalidHeader"},
      {"overlong utf-8", make_file("{\"x\xc0\xaf\":1}"), "InvalidHeader"},
      {"utf-8 surrogate", make_file("{\"x\xed\xa0\x80\":1}"), "InvalidHeader"},
      {"not json", make_file("hello"), "InvalidHeaderDeserialization"},
      {"empty header", make_file(""), "InvalidHeaderDeserialization"},
      {"top-level array", make_file("[]"), "InvalidHeaderDeserialization"},
      {"tensor not an object", make_file("{\"x\":1}"), "InvalidHeaderDeserialization"},
      {"unknown dtype", make_file("{" + tensor_json("x", "U9", "[2]", 0, 2) + "}", "ab"),
       "InvalidHeaderDeserialization"},
      {"complex128, which safetensors lacks",
       make_file("{" + tensor_json("x", "C128", "[1]", 0, 16) + "}", std::string(16, '\0')),
       "InvalidHeaderDeserialization"},
      {"lowercase dtype", make_file("{" + tensor_json("x", "u8", "[2]", 0, 2) + "}", "ab"),
       "InvalidHeaderDeserialization"},
      {"negative dim", make_file("{" + tensor_json("x", "U8", "[-2]", 0, 2) + "}", "ab"),
       "InvalidHeaderDeserialization"},
      {"float dim", make_file("{" + tensor_json("x", "U8", "[2.0]", 0, 2) + "}", "ab"),
       "InvalidHeaderDeserialization"},
      {"exponent dim", make_file("{" + tensor_json("x", "U8", "[2e0]", 0, 2) + "}", "ab"),
       "InvalidHeaderDeserialization"},
      {"dim over 2^64",
       make_file("{" + tensor_json("x", "U8", "[18446744073709551616]", 0, 2) + "}"),
       "InvalidHeaderDeserialization"},
      {"shape not an array", make_file("{" + tensor_json("x", "U8", "2", 0, 2) + "}", "ab"),
       "InvalidHeaderDeserialization"},
      {"negative offset",
       make_file("{\"x\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[-1,0]}}"),
       "InvalidHeaderDeserialization"},
      {"three offsets",
       make_file("{\"x\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2,2]}}", "ab"),
       "InvalidHeaderDeserialization"},
      {"missing shape", make_file("{\"x\":{\"dtype\":\"U8\",\"data_offsets\":[0,2]}}", "ab"),
       "InvalidHeaderDeserialization"},
      {"duplicate field",
       make_file("{\"x\":{\"dtype\":\"U8\",\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}",
                 "ab"),
       "InvalidHeaderDeserialization"},
      {"metadata value not a string", make_file("{\"__metadata__\":{\"a\":1}}"),
       "InvalidHeaderDeserialization"},
      {"metadata not an object", make_file("{\"__metadata__\":[]}"),
       "InvalidHeaderDeserialization"},
      {"trailing comma", make_file("{" + kX + ",}", "ab"), "InvalidHeaderDeserialization"},
      {"trailing characters", make_file("{" + kX + "}x", "ab"), "InvalidHeaderDeserialization"},
      {"nul padding", make_file("{" + kX + "}" + std::string(1, '\0'), "ab"),
       "InvalidHeaderDeserialization"},
      {"lone surrogate escape", make_file("{\"x\\ud800\":" + kX.substr(4) + "}", "ab"),
       "InvalidHeaderDeserialization"},
      {"control character in string", make_file("{\"x\x01\":" + kX.substr(4) + "}", "ab"),
       "InvalidHeaderDeserialization"},
      {"invalid escape", make_file("{\"x\\q\":" + kX.substr(4) + "}", "ab"),
       "InvalidHeaderDeserialization"},
      {"nesting deeper than 128", make_file(deep, "ab"), "InvalidHeaderDeserialization"},
      {"number out of range in unknown field",
       make_file("{\"x\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2],\"e\":1e999}}",
                 "ab"),
       "InvalidHeaderDeserialization"},
      {"NaN",
       make_file("{\"x\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2],\"e\":NaN}}", "ab"),
       "InvalidHeaderDeserialization"},
      {"byte order mark", make_file("\xef\xbb\xbf{}"), "InvalidHeaderDeserialization"},
      {"duplicate tensor name", make_file("{" + kX + "," + kX + "}", "ab"), "DuplicateKey"},
      {"duplicate metadata key", make_file("{\"__metadata__\":{\"a\":\"b\",\"a\":\"c\"}}"),
       "DuplicateKey"},
      {"duplicate __metadata__", make_file("{\"__metadata__\":{},\"__metadata__\":{}}"),
       "DuplicateKey"},
      {"first tensor not at 0", make_file("{" + tensor_json("x", "U8", "[2]", 1, 3) + "}", "abc"),
       "InvalidOffset"},
      {"hole between tensors",
       make_file("{" + tensor_json("a", "U8", "[2]", 0, 2) + "," +
                     tensor_json("b", "U8", "[2]", 3, 5) + "}",
                 "abcde"),
       "InvalidOffset"},
      {"overlapping tensors",
       make_file("{" + tensor_json("a", "U8", "[2]", 0, 2) + "," +
                     tensor_json("b", "U8", "[2]", 0, 2) + "}",
                 "ab"),
       "InvalidOffset"},
      {"end before begin", make_file("{" + tensor_json("x", "U8", "[0]", 2, 0) + "}", "ab"),
       "InvalidOffset"},
      {"element count overflows",
       make_file("{" + tensor_json("x", "U8", "[4294967296,4294967296]", 0, 2) + "}", "ab"),
       "ValidationOverflow"},
      {"byte size overflows",
       make_file("{" + tensor_json("x", "F32", "[4611686018427387904]", 0, 4) + "}", "abcd"),
       "ValidationOverflow"},
      // The reference's MisalignedSlice, checked before the byte count.
      {"F4 bits do not end on a byte",
       make_file("{" + tensor_json("x", "F4", "[3,7]", 0, 11) + "}", std::string(11, 'a')),
       "MisalignedSlice"},
      {"F4 scalar", make_file("{" + tensor_json("x", "F4", "[]", 0, 1) + "}", "a"),
       "MisalignedSlice"},
      {"F6 of 3 elements", make_file("{" + tensor_json("x", "F6_E2M3", "[3]", 0, 2) + "}", "ab"),
       "MisalignedSlice"},
      {"F4 size in bits overflows",
       make_file("{" + tensor_json("x", "F4", "[2305843009213693952,2]", 0, 4) + "}", "abcd"),
       "ValidationOverflow"},
      {"F4 size does not match",
       make_file("{" + tensor_json("x", "F4", "[2,4]", 0, 3) + "}", "abc"), "TensorInvalidInfo"},
      {"size does not match shape",
       make_file("{" + tensor_json("x", "U8", "[2]", 0, 3) + "}", "abc"), "TensorInvalidInfo"},
      {"size does not match dtype",
       make_file("{" + tensor_json("x", "F32", "[2]", 0, 4) + "}", "abcd"), "TensorInvalidInfo"},
      {"truncated data", make_file("{" + kX + "}", "a"), "MetadataIncompleteBuffer"},
      {"trailing bytes", make_file("{" + kX + "}", "abc"), "MetadataIncompleteBuffer"},
      {"trailing bytes after empty header", make_file("{}", "x"), "MetadataIncompleteBuffer"},
  };
}

TEST(SafetensorsTest, AMisalignedSubByteTensorHasTheReferencesWords) {
  try {
    parse(make_file("{" + tensor_json("w", "F4", "[3,7]", 0, 11) + "}", std::string(11, 'a')));
    FAIL() << "accepted";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find(kSubbyteMisalignedMessage), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("84 bits"), std::string::npos) << e.what();
  }
}

TEST(SafetensorsTest, RejectsEachMalformedFileNamingTheRule) {
  TempDir dir;
  for (const MalformedCase& c : malformed_cases()) {
    SCOPED_TRACE(c.description);
    try {
      parse(c.bytes);
      ADD_FAILURE() << "accepted: " << c.description;
    } catch (const FormatError& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(std::string(": ") + c.rule + ": "), std::string::npos) << message;
      EXPECT_EQ(message.rfind("'/x/a.safetensors': ", 0), 0u) << message;
    }
    // The same through the file reader and the header-only reader.
    const std::string path = dir.file("bad.safetensors");
    write_bytes(path, c.bytes);
    try {
      SafetensorsFile::open(path);
      ADD_FAILURE() << "SafetensorsFile accepted: " << c.description;
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos);
      EXPECT_NE(std::string(e.what()).find(c.rule), std::string::npos) << e.what();
    }
    try {
      read_safetensors_header(path);
      ADD_FAILURE() << "read_safetensors_header accepted: " << c.description;
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find(c.rule), std::string::npos) << e.what();
    }
  }
}

TEST(SafetensorsTest, MessagesGiveTheValues) {
  const std::string bytes = make_file(
      "{" + tensor_json("v", "U8", "[8]", 0, 8) + "," + tensor_json("w", "U8", "[8]", 16, 24) + "}",
      std::string(24, 'a'));
  try {
    parse(bytes);
    FAIL();
  } catch (const FormatError& e) {
    EXPECT_STREQ(e.what(),
                 "'/x/a.safetensors': InvalidOffset: tensor 'w' begins at 16 but the previous "
                 "tensor 'v' ends at 8 (data offsets must be sorted, start at 0 and be "
                 "contiguous)");
  }
}

TEST(SafetensorsTest, AcceptsWellFormedVariants) {
  // Only "{}": no tensors, no metadata, as the reference writes it.
  {
    const SafetensorsHeader header = parse(make_file("{}      "));
    EXPECT_TRUE(header.tensors.empty());
    EXPECT_FALSE(header.has_metadata);
    EXPECT_EQ(header.data_offset, 16u);
  }
  // Rank 0, zero-sized, metadata, out-of-order members, whitespace around
  // and inside the JSON, unknown fields, escapes.
  const std::string json =
      " \n{ \"__metadata__\" : {\"format\":\"pt\", \"k\\n\":\"v\\u00e9\\ud83d\\ude00\"},\r\n"
      "\t\"z\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16], \"extra\":[{\"a\":null},"
      "true,false,-1.5e-3,1e-999]},"
      "\"scalar\":{\"shape\":[],\"data_offsets\":[0,8],\"dtype\":\"F64\"},"
      "\"empty\":{\"dtype\":\"I32\",\"shape\":[3,0],\"data_offsets\":[16,16]},"
      "\"a\\/b\\\"\":{\"dtype\":\"U8\",\"shape\":[1,1],\"data_offsets\":[16,17]}}   ";
  const SafetensorsHeader header = parse(make_file(json, std::string(17, '\0')));
  ASSERT_EQ(header.tensors.size(), 4u);
  EXPECT_EQ(header.tensors[0].name, "scalar");
  EXPECT_EQ(header.tensors[0].shape, Shape{});
  EXPECT_EQ(header.tensors[0].dtype, DType::kF64);
  EXPECT_EQ(header.tensors[1].name, "z");
  EXPECT_EQ(header.tensors[1].begin, 8u);
  EXPECT_EQ(header.tensors[1].end, 16u);
  EXPECT_EQ(header.tensors[2].name, "empty");
  EXPECT_EQ(header.tensors[2].shape, (Shape{3, 0}));
  EXPECT_EQ(header.tensors[3].name, "a/b\"");
  EXPECT_TRUE(header.has_metadata);
  EXPECT_EQ(header.metadata.at("format"), "pt");
  EXPECT_EQ(header.metadata.at("k\n"), "v\xc3\xa9\xf0\x9f\x98\x80");
  EXPECT_EQ(header.data_offset, 8 + json.size());

  // "__metadata__": null means no metadata (as in the reference).
  EXPECT_FALSE(parse(make_file("{\"__metadata__\":null}")).has_metadata);
  // Every dtype name of the DType set.
  for (const DType dtype : kAllDTypes) {
    if (!dtype_in_safetensors(dtype)) continue;
    const size_t size = *checked_nbytes(Shape{4}, dtype);  // 4 x 4 and 4 x 6 bits pack
    const SafetensorsHeader h = parse(
        make_file("{" + tensor_json("t", std::string(dtype_name(dtype)), "[4]", 0, size) + "}",
                  std::string(size, '\0')));
    EXPECT_EQ(h.tensors.at(0).dtype, dtype);
  }
  // Sub-byte tensors pack on the total bit count, as in the reference: F4
  // [2, 3] is 3 bytes even though a row is not whole bytes.
  EXPECT_EQ(parse(make_file("{" + tensor_json("t", "F4", "[2,3]", 0, 3) + "}", "abc"))
                .tensors.at(0)
                .shape,
            (Shape{2, 3}));
  EXPECT_EQ(parse(make_file("{" + tensor_json("t", "F6_E3M2", "[4,1]", 0, 3) + "}", "abc"))
                .tensors.at(0)
                .end,
            3u);
}

TEST(SafetensorsTest, ReadsTensorsZeroCopyFromTheMapping) {
  TempDir dir;
  const std::string path = dir.file("a.safetensors");
  std::string data(8 + 12 + 0 + 1, '\0');
  const double scalar = 2.5;
  const float values[3] = {1.f, -2.f, 3.5f};
  std::memcpy(data.data(), &scalar, 8);
  std::memcpy(data.data() + 8, values, 12);
  data[20] = 7;
  write_bytes(path, make_file("{" + tensor_json("s", "F64", "[]", 0, 8) + "," +
                                  tensor_json("v", "F32", "[3]", 8, 20) + "," +
                                  tensor_json("e", "F32", "[0,4]", 20, 20) + "," +
                                  tensor_json("b", "U8", "[1]", 20, 21) + "}      ",
                              data));
  auto file = SafetensorsFile::open(path);
  ASSERT_EQ(file->header().data_offset % 8, 0u);
  const Tensor s = file->tensor("s");
  EXPECT_EQ(s.storage()->kind(), StorageKind::kMapped);
  EXPECT_EQ(s.ndim(), 0u);
  EXPECT_EQ(*reinterpret_cast<const double*>(s.data()), 2.5);
  const Tensor v = file->tensor("v");
  EXPECT_EQ(v.storage().get(), file->mapping().get());
  EXPECT_EQ(v.data(), file->mapping()->data() + file->header().data_offset + 8);
  EXPECT_EQ(reinterpret_cast<const float*>(v.data())[2], 3.5f);
  const Tensor e = file->tensor("e");
  EXPECT_EQ(e.numel(), 0u);
  EXPECT_EQ(e.shape(), (Shape{0, 4}));
  EXPECT_EQ(static_cast<int>(file->tensor(3).data()[0]), 7);
  EXPECT_THROW(file->tensor("missing"), InvalidArgument);
  EXPECT_THROW(file->tensor(4), InvalidArgument);

  // Tensors keep the mapping alive after the file object is gone.
  std::weak_ptr<SafetensorsFile> weak = file;
  Tensor kept = file->tensor("v");
  file.reset();
  EXPECT_TRUE(weak.expired());
  EXPECT_EQ(reinterpret_cast<const float*>(kept.data())[0], 1.f);
}

TEST(SafetensorsTest, CopiesMisalignedDataToAlignedStorage) {
  TempDir dir;
  const std::string path = dir.file("misaligned.safetensors");
  // A third-party layout: no padding, so the data starts at an odd offset.
  std::string json =
      "{" + tensor_json("b", "U8", "[1]", 0, 1) + "," + tensor_json("f", "F32", "[2]", 1, 9) + "}";
  while ((8 + json.size()) % 4 != 1) json += " ";
  std::string data(9, '\0');
  const float values[2] = {1.25f, -4.f};
  std::memcpy(data.data() + 1, values, 8);
  write_bytes(path, make_file(json, data));
  const auto file = SafetensorsFile::open(path);
  ASSERT_NE((file->header().data_offset + 1) % 4, 0u);
  const Tensor f = file->tensor("f");
  EXPECT_EQ(f.storage()->kind(), StorageKind::kHeap);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(f.data()) % 4, 0u);
  float read[2];
  std::memcpy(read, f.data(), 8);
  EXPECT_EQ(read[0], 1.25f);
  EXPECT_EQ(read[1], -4.f);
  // Byte-sized dtypes are never misaligned.
  EXPECT_EQ(file->tensor("b").storage()->kind(), StorageKind::kMapped);
}

Tensor heap_tensor(DType dtype, Shape shape, uint8_t seed) {
  const size_t nbytes = checked_nbytes(shape, dtype).value();
  auto storage = HeapStorage::allocate(nbytes);
  for (size_t i = 0; i < nbytes; ++i) {
    storage->data()[i] = static_cast<std::byte>(seed + i * 7);
  }
  return Tensor(storage, 0, dtype, std::move(shape));
}

TEST(SafetensorsTest, WritesTheReferenceLayoutByteForByte) {
  // The reference's own test_serialization: one F32 tensor [1,2,3].
  TempDir dir;
  const std::string path = dir.file("ref.safetensors");
  auto storage = HeapStorage::allocate(24);
  const float values[6] = {0, 1, 2, 3, 4, 5};
  std::memcpy(storage->data(), values, 24);
  save_safetensors(path, {{"attn.0", Tensor(storage, 0, DType::kF32, {1, 2, 3})}});
  const unsigned char expected[] = {
      64, 0,  0,   0,   0,   0,   0,   0,   123, 34,  97,  116, 116, 110, 46,  48,
      34, 58, 123, 34,  100, 116, 121, 112, 101, 34,  58,  34,  70,  51,  50,  34,
      44, 34, 115, 104, 97,  112, 101, 34,  58,  91,  49,  44,  50,  44,  51,  93,
      44, 34, 100, 97,  116, 97,  95,  111, 102, 102, 115, 101, 116, 115, 34,  58,
      91, 48, 44,  50,  52,  93,  125, 125, 0,   0,   0,   0,   0,   0,   128, 63,
      0,  0,  0,   64,  0,   0,   64,  64,  0,   0,   128, 64,  0,   0,   160, 64};
  EXPECT_EQ(read_bytes(path),
            std::string(reinterpret_cast<const char*>(expected), sizeof(expected)));

  // The reference's test_empty, with and without metadata.
  save_safetensors(path, {});
  EXPECT_EQ(read_bytes(path), make_file("{}      "));
  save_safetensors(path, {}, std::map<std::string, std::string>{{"framework", "pt"}});
  EXPECT_EQ(read_bytes(path), make_file("{\"__metadata__\":{\"framework\":\"pt\"}}     "));
}

TEST(SafetensorsTest, RoundTripsEveryDTypeInReferenceOrder) {
  TempDir dir;
  const std::string path = dir.file("all.safetensors");
  std::vector<std::pair<std::string, Tensor>> tensors;
  uint8_t seed = 1;
  for (const DType dtype : kAllDTypes) {
    if (!dtype_in_safetensors(dtype)) continue;
    tensors.emplace_back("t_" + std::string(dtype_name(dtype)), heap_tensor(dtype, {2, 4}, seed++));
  }
  tensors.emplace_back("scalar", heap_tensor(DType::kF64, {}, 9));
  tensors.emplace_back("empty", heap_tensor(DType::kI16, {0, 5}, 0));
  const std::map<std::string, std::string> metadata = {{"format", "pt"},
                                                       {"quote\"\n\x01", "\xc3\xa9\x7f"}};
  save_safetensors(path, tensors, metadata);

  const auto file = SafetensorsFile::open(path);
  EXPECT_EQ(file->header().metadata, metadata);
  EXPECT_EQ(file->header().data_offset % 8, 0u);
  ASSERT_EQ(file->size(), tensors.size());
  for (const auto& [name, tensor] : tensors) {
    SCOPED_TRACE(name);
    const Tensor read = file->tensor(name);
    EXPECT_EQ(read.dtype(), tensor.dtype());
    EXPECT_EQ(read.shape(), tensor.shape());
    EXPECT_EQ(read.storage()->kind(), StorageKind::kMapped);  // every tensor aligned
    EXPECT_EQ(std::memcmp(read.data(), tensor.data(), tensor.nbytes()), 0);
  }
  // Write order: 8-byte dtypes first (U64, I64, F64, C64), then by name.
  const auto& order = file->header().tensors;
  EXPECT_EQ(order[0].name, "t_U64");
  EXPECT_EQ(order[1].name, "t_I64");
  EXPECT_EQ(order[2].name, "scalar");
  EXPECT_EQ(order[3].name, "t_F64");
  EXPECT_EQ(order[4].name, "t_C64");
  EXPECT_EQ(order.back().name, "t_BOOL");

  // The header-only reader agrees.
  const SafetensorsHeader header = read_safetensors_header(path);
  EXPECT_EQ(header.data_offset, file->header().data_offset);
  ASSERT_EQ(header.tensors.size(), order.size());
  for (size_t i = 0; i < order.size(); ++i) EXPECT_EQ(header.tensors[i].name, order[i].name);
}

TEST(SafetensorsTest, WritesNonContiguousTensorsRowMajor) {
  TempDir dir;
  const std::string path = dir.file("t.safetensors");
  // A 2x3 int32 matrix viewed transposed as 3x2.
  auto storage = HeapStorage::allocate(24);
  const int32_t values[6] = {0, 1, 2, 3, 4, 5};
  std::memcpy(storage->data(), values, 24);
  const Tensor transposed(storage, 0, DType::kI32, {3, 2}, {1, 3});
  ASSERT_FALSE(transposed.is_contiguous());
  save_safetensors(path, {{"t", transposed}});
  const Tensor read = SafetensorsFile::open(path)->tensor("t");
  const int32_t expected[6] = {0, 3, 1, 4, 2, 5};
  EXPECT_EQ(std::memcmp(read.data(), expected, 24), 0);
}

size_t count_temporary_files(const fs::path& directory) {
  size_t count = 0;
  for (const auto& entry : fs::directory_iterator(directory)) {
    if (entry.path().filename().string().find(".tmp.") != std::string::npos) ++count;
  }
  return count;
}

TEST(SafetensorsTest, RejectsBadArgumentsBeforeWriting) {
  TempDir dir;
  const std::string path = dir.file("bad.safetensors");
  const Tensor t = heap_tensor(DType::kU8, {2}, 0);
  EXPECT_THROW(save_safetensors(path, {{"__metadata__", t}}), InvalidArgument);
  EXPECT_THROW(save_safetensors(path, {{"a", t}, {"a", t}}), InvalidArgument);
  EXPECT_THROW(save_safetensors(path, {{"a", Tensor()}}), InvalidArgument);
  EXPECT_THROW(save_safetensors(path, {{"\xff", t}}), InvalidArgument);
  EXPECT_THROW(save_safetensors(path, {{"c", heap_tensor(DType::kC128, {2}, 0)}}), InvalidArgument);
  EXPECT_FALSE(fs::exists(path));
  EXPECT_EQ(count_temporary_files(dir.path()), 0u);
}

TEST(SafetensorsTest, FailedWriteLeavesNoTemporaryFileAndKeepsTheOldFile) {
  TempDir dir;
  // The target is a non-empty directory: the rename fails after the data is
  // written, so the temporary file must be cleaned up.
  const std::string path = dir.file("target.safetensors");
  fs::create_directory(path);
  write_bytes(path + "/keep", "x");
  try {
    save_safetensors(path, {{"a", heap_tensor(DType::kF32, {4}, 1)}});
    FAIL() << "rename over a directory succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  EXPECT_EQ(count_temporary_files(dir.path()), 0u);
  EXPECT_TRUE(fs::is_directory(path));

  // A missing directory is reported as not found.
  try {
    save_safetensors(dir.file("missing/x.safetensors"), {});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kNotFound);
  }

  // Overwriting publishes the new file whole; readers that mapped the old one
  // keep seeing the old bytes.
  const std::string file_path = dir.file("a.safetensors");
  save_safetensors(file_path, {{"a", heap_tensor(DType::kU8, {4}, 1)}});
  const Tensor old = SafetensorsFile::open(file_path)->tensor("a");
  const std::string old_bytes(reinterpret_cast<const char*>(old.data()), 4);
  save_safetensors(file_path, {{"a", heap_tensor(DType::kU8, {4}, 100)}});
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(old.data()), 4), old_bytes);
  const Tensor fresh = SafetensorsFile::open(file_path)->tensor("a");
  EXPECT_EQ(static_cast<int>(fresh.data()[0]), 100);
  EXPECT_EQ(count_temporary_files(dir.path()), 0u);
}

TEST(SafetensorsTest, PartialHeaderBytesAreACallerError) {
  const std::string bytes = make_file("{" + kX + "}", "ab");
  EXPECT_THROW(
      parse_safetensors_header(std::span(reinterpret_cast<const std::byte*>(bytes.data()), 12),
                               bytes.size(), "p"),
      InvalidArgument);
}

}  // namespace
}  // namespace leanloader
