#include "leanloader/core/tensor.h"

#include <gtest/gtest.h>

#include <numeric>

#include "leanloader/core/error.h"

namespace leanloader {
namespace {

TEST(DTypeTest, NamesRoundTripAndSizes) {
  for (const DType dtype : kAllDTypes) {
    EXPECT_EQ(dtype_from_name(dtype_name(dtype)), dtype);
    EXPECT_EQ(dtype_from_dlpack(dlpack_type(dtype)), dtype);
    EXPECT_EQ(dlpack_type(dtype).bits, dtype_size(dtype) * 8);
  }
  EXPECT_EQ(dtype_size(DType::kBF16), 2u);
  EXPECT_EQ(dtype_size(DType::kF8E4M3), 1u);
  EXPECT_FALSE(dtype_from_name("F4").has_value());
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
}

}  // namespace
}  // namespace leanloader
