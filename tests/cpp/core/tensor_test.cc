#include "leanloader/core/tensor.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <iterator>
#include <numeric>
#include <optional>
#include <utility>

#include "leanloader/core/error.h"

namespace leanloader {
namespace {

TEST(DTypeTest, NamesRoundTripAndSizes) {
  for (const DType dtype : kAllDTypes) {
    EXPECT_EQ(dtype_from_name(dtype_name(dtype)), dtype);
    EXPECT_EQ(dtype_from_dlpack(dlpack_type(dtype)), dtype);
    EXPECT_EQ(dlpack_type(dtype).bits, dtype_bits(dtype));
    if (!dtype_is_subbyte(dtype)) {
      EXPECT_EQ(dtype_bits(dtype), dtype_size(dtype) * 8);
    }
  }
  EXPECT_EQ(dtype_size(DType::kBF16), 2u);
  EXPECT_EQ(dtype_size(DType::kF8E4M3), 1u);
  EXPECT_FALSE(dtype_from_name("F2").has_value());
  EXPECT_FALSE(dtype_from_name("f4").has_value());
}

TEST(DTypeTest, EveryReferenceDtypeWithItsBitSize) {
  // safetensors 0.8.0's Dtype and bitsize(), spelled as in its headers.
  const std::pair<const char*, size_t> reference[] = {
      {"BOOL", 8},        {"F4", 4},          {"F6_E2M3", 6}, {"F6_E3M2", 6}, {"U8", 8},
      {"I8", 8},          {"F8_E5M2", 8},     {"F8_E4M3", 8}, {"F8_E8M0", 8}, {"I16", 16},
      {"U16", 16},        {"F16", 16},        {"BF16", 16},   {"I32", 32},    {"U32", 32},
      {"F32", 32},        {"C64", 64},        {"F64", 64},    {"I64", 64},    {"U64", 64},
      {"F8_E4M3FNUZ", 8}, {"F8_E5M2FNUZ", 8},
  };
  for (const auto& [name, bits] : reference) {
    const std::optional<DType> dtype = dtype_from_name(name);
    ASSERT_TRUE(dtype.has_value()) << name;
    EXPECT_EQ(dtype_bits(*dtype), bits) << name;
  }
  // Every dtype but complex128, which safetensors lacks.
  EXPECT_EQ(std::size(kAllDTypes), std::size(reference) + 1);
  EXPECT_FALSE(dtype_in_safetensors(DType::kC128));
  EXPECT_EQ(dtype_bits(DType::kC128), 128u);
  EXPECT_TRUE(dtype_is_subbyte(DType::kF4));
  EXPECT_TRUE(dtype_is_subbyte(DType::kF6E2M3));
  EXPECT_FALSE(dtype_is_subbyte(DType::kBool));
  // DLPack 1.1: kDLFloat6_e2m3fn = 15, kDLFloat6_e3m2fn = 16, kDLFloat4_e2m1fn = 17.
  EXPECT_EQ(dlpack_type(DType::kF6E2M3).code, 15);
  EXPECT_EQ(dlpack_type(DType::kF6E3M2).code, 16);
  EXPECT_EQ(dlpack_type(DType::kF4).code, 17);
  EXPECT_EQ(dlpack_type(DType::kF8E8M0).code, 14);
}

TEST(TensorTest, ViewsStorageWithoutCopy) {
  auto storage = HeapStorage::allocate(64);
  const Tensor tensor(storage, 16, DType::kF32, {2, 3});
  EXPECT_EQ(tensor.data(), storage->data() + 16);
  EXPECT_EQ(tensor.nbytes(), 24u);
  EXPECT_TRUE(tensor.is_contiguous());
  EXPECT_EQ(tensor.strides(), (Shape{3, 1}));
}

TEST(TensorTest, RejectsViewsPastTheStorage) {
  auto storage = HeapStorage::allocate(16);
  EXPECT_THROW(Tensor(storage, 8, DType::kF32, {3}), InvalidArgument);
  EXPECT_THROW(Tensor(storage, 0, DType::kF32, {-1}), InvalidArgument);
}

TEST(TensorTest, SubByteTensorsArePackedAndDense) {
  auto storage = HeapStorage::allocate(12);
  const Tensor f4(storage, 0, DType::kF4, {3, 8});
  EXPECT_EQ(f4.nbytes(), 12u);
  EXPECT_EQ(Tensor(storage, 9, DType::kF6E2M3, {4}).nbytes(), 3u);
  EXPECT_THROW(Tensor(storage, 1, DType::kF4, {3, 8}), InvalidArgument);          // past the end
  EXPECT_THROW(Tensor(storage, 0, DType::kF4, {3, 7}), InvalidArgument);          // 84 bits
  EXPECT_THROW(Tensor(storage, 0, DType::kF4, {2, 2}, {4, 1}), InvalidArgument);  // strided
  std::vector<std::byte> out(12);
  for (size_t i = 0; i < 12; ++i) storage->data()[i] = std::byte(i);
  f4.copy_to(out.data());
  EXPECT_EQ(out[11], std::byte{11});
}

TEST(TensorTest, StridedCopyMatchesElementOrder) {
  // A 4x6 int32 matrix; view every second column and transpose.
  auto storage = HeapStorage::allocate(24 * 4);
  auto* values = reinterpret_cast<int32_t*>(storage->data());
  std::iota(values, values + 24, 0);
  const Tensor columns(storage, 0, DType::kI32, {4, 3}, {6, 2});
  std::vector<int32_t> out(12);
  columns.copy_to(reinterpret_cast<std::byte*>(out.data()));
  EXPECT_EQ(out, (std::vector<int32_t>{0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22}));
  const Tensor transposed(storage, 0, DType::kI32, {6, 4}, {1, 6});
  std::vector<int32_t> t(24);
  transposed.copy_to(reinterpret_cast<std::byte*>(t.data()));
  EXPECT_EQ(t[1], 6);
  EXPECT_EQ(t[4], 1);
}

TEST(TensorTest, ShapeOverflowIsAnError) {
  EXPECT_THROW(shape_numel({1LL << 40, 1LL << 40}), InvalidArgument);
  // Strides count a 0 dimension as 1, as numpy: an empty shape whose other
  // dimensions overflow is refused, not computed with a signed overflow.
  EXPECT_EQ(contiguous_strides({3, 0, 4}), (Shape{4, 4, 1}));
  EXPECT_EQ(shape_numel({1LL << 40, 0, 1LL << 40}), 0u);
  EXPECT_THROW(contiguous_strides({1LL << 40, 0, 1LL << 40}), InvalidArgument);
}

TEST(TensorTest, ViewsWhoseBytesOrReachWrapAreRejected) {
  auto storage = HeapStorage::allocate(4096);
  // numel fits, numel x 8 bytes wraps to 0 (a (1, 2^61) float64 header).
  EXPECT_THROW(Tensor(storage, 0, DType::kF64, {1, int64_t{1} << 61}), InvalidArgument);
  // A broadcast view (stride 0) whose bytes would wrap.
  EXPECT_THROW(Tensor(storage, 0, DType::kI32, {int64_t{1} << 62}, {0}), InvalidArgument);
  // (dim - 1) x stride wraps back inside the storage.
  EXPECT_THROW(Tensor(storage, 0, DType::kU8, {2, 2}, {int64_t{1} << 62, 1}), InvalidArgument);
  EXPECT_THROW(Tensor(storage, 0, DType::kU8, {5, 2}, {int64_t{1} << 62, 1}), InvalidArgument);
  // An offset near the end of the address space.
  EXPECT_THROW(Tensor(storage, SIZE_MAX - 2, DType::kU8, {4}), InvalidArgument);
  // A broadcast view that stays inside is fine.
  EXPECT_NO_THROW(Tensor(storage, 0, DType::kI32, {1000}, {0}));
}

}  // namespace
}  // namespace leanloader
