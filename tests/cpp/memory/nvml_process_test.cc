// NVML process records parsed without NVML: v1 (16-byte) and v2 (24-byte)
// layouts, NVML_VALUE_NOT_AVAILABLE, duplicates, short buffers, growth.
#include "memory/nvml_process.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "leanloader/memory/memory_monitor.h"

namespace leanloader::detail {
namespace {

std::vector<std::byte> records(size_t stride,
                               std::initializer_list<std::pair<uint32_t, uint64_t>> recs) {
  std::vector<std::byte> raw(stride * recs.size(), std::byte{0x55});
  size_t i = 0;
  for (auto [pid, used] : recs) {
    std::memcpy(raw.data() + i * stride, &pid, sizeof pid);
    std::memcpy(raw.data() + i * stride + 8, &used, sizeof used);
    ++i;
  }
  return raw;
}

TEST(NvmlProcess, V1AndV2Layouts) {
  for (size_t stride : {kNvmlProcessInfoV1Bytes, kNvmlProcessInfoV2Bytes, size_t{32}}) {
    auto raw = records(stride, {{100, 1u << 20}, {200, 3u << 30}});
    GpuProcessBytes out;
    ASSERT_TRUE(parse_nvml_processes(raw, 2, stride, out));
    ASSERT_EQ(out.size(), 2u);
    EXPECT_EQ(out.at(100), std::optional<uint64_t>(1u << 20));
    EXPECT_EQ(out.at(200), std::optional<uint64_t>(uint64_t{3} << 30));
  }
}

TEST(NvmlProcess, NotAvailableIsUnknown) {
  auto raw = records(24, {{7, kNvmlValueNotAvailable}});
  GpuProcessBytes out;
  ASSERT_TRUE(parse_nvml_processes(raw, 1, 24, out));
  EXPECT_FALSE(out.at(7).has_value());
  // A known figure for the same pid does not hide the unknown one.
  auto more = records(24, {{7, 4096}});
  ASSERT_TRUE(parse_nvml_processes(more, 1, 24, out));
  EXPECT_FALSE(out.at(7).has_value());
}

TEST(NvmlProcess, SamePidInBothListsTakesLarger) {
  GpuProcessBytes out;
  auto compute = records(24, {{9, 1000}});
  auto graphics = records(24, {{9, 5000}});
  ASSERT_TRUE(parse_nvml_processes(compute, 1, 24, out));
  ASSERT_TRUE(parse_nvml_processes(graphics, 1, 24, out));
  EXPECT_EQ(out.at(9), std::optional<uint64_t>(5000));
}

TEST(NvmlProcess, ShortBufferAndBadStrideRefused) {
  auto raw = records(24, {{1, 1}});
  GpuProcessBytes out;
  EXPECT_FALSE(parse_nvml_processes(raw, 2, 24, out));
  EXPECT_FALSE(parse_nvml_processes(raw, 1, 8, out));
  EXPECT_FALSE(parse_nvml_processes(raw, SIZE_MAX, 24, out));
  EXPECT_TRUE(out.empty());
}

TEST(NvmlProcess, GrowCapacityBounded) {
  EXPECT_EQ(nvml_grow_capacity(10, 24), std::optional<size_t>(18));
  EXPECT_FALSE(nvml_grow_capacity(5000, 24).has_value());
  EXPECT_FALSE(nvml_grow_capacity(SIZE_MAX, 24).has_value());
  EXPECT_FALSE(nvml_grow_capacity(100, SIZE_MAX, SIZE_MAX).has_value());
}

}  // namespace
}  // namespace leanloader::detail

namespace leanloader {
namespace {

TEST(NvmlProcessTest, AProcessesGpuBytesAreSummedOverGpusAndUnknownStaysUnknown) {
  GpuMemory first, second;
  first.process_bytes = {{10, 100}, {11, std::nullopt}};
  second.process_bytes = {{10, 50}};
  const std::vector<GpuMemory> gpus = {first, second};
  EXPECT_EQ(process_gpu_bytes(gpus, 10), std::optional<uint64_t>(150));
  EXPECT_EQ(process_gpu_bytes(gpus, 11), std::nullopt);
  EXPECT_EQ(process_gpu_bytes(gpus, 12), std::optional<uint64_t>(0));  // no context: none
}

}  // namespace
}  // namespace leanloader
