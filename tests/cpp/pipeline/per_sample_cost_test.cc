// Costs removed from the per-sample path stay removed: counted, not timed
// (docs/ARCHITECTURE.md, "What a sample costs").
#include <gtest/gtest.h>

#include <chrono>
#include <numeric>
#include <vector>

#include "allocation_hooks.h"
#include "leanloader/pipeline/loader.h"
#include "leanloader/sources/array_source.h"
#include "leanloader/sources/npy_source.h"
#include "test_util.h"

namespace leanloader {
namespace {

using namespace std::chrono_literals;

// Hands out one buffer, sized once, for every sample.
class FixedWriter final : public SampleWriter {
 public:
  FixedWriter(size_t bytes, bool streaming) : buffer_(bytes), streaming_(streaming) {}
  bool prefers_streaming_stores() const override { return streaming_; }
  std::span<std::byte> field_buffer(size_t /*field*/, const Shape& /*shape*/) override {
    return buffer_;
  }

 private:
  std::vector<std::byte> buffer_;
  bool streaming_;
};

// Allocations made by reading rows first..first+count-1 of `source`.
size_t allocations_reading(const Source& source, SampleWriter& writer, int64_t count) {
  source.read_sample(0, writer);  // first use: lazily made state, not per sample
  const size_t before = testing::allocation_count();
  for (int64_t row = 0; row < count; ++row) source.read_sample(row, writer);
  return testing::allocation_count() - before;
}

// ArraySource built a strides vector per sample, and copy_strided two more
// for a strided row (heap allocations); the row layout is now worked out at
// construction and copy_strided merges dimensions on the stack.
TEST(PerSampleCostTest, ArraySourceRowsAllocateNothing) {
  auto storage = HeapStorage::allocate(256 * 64 * 4);
  const Tensor rows(storage, 0, DType::kF32, {256, 8, 8});
  // Every other column: a strided row.
  const Tensor strided(storage, 0, DType::kF32, {256, 8, 4}, {64, 8, 2});
  const ArraySource source({{"rows", rows}, {"strided", strided}});
  for (const bool streaming : {false, true}) {
    FixedWriter writer(64 * 4, streaming);
    EXPECT_EQ(allocations_reading(source, writer, 256), 0u) << streaming;
  }
}

TEST(PerSampleCostTest, NpySourceRowsAllocateNothing) {
  testing::TempDir dir;
  for (const int64_t row_values : {int64_t{1024}, int64_t{65536}}) {  // mapped, pread
    std::vector<float> x(static_cast<size_t>(16 * row_values));
    std::iota(x.begin(), x.end(), 0.0f);
    const std::string path = dir.file("x" + std::to_string(row_values) + ".npy");
    testing::write_npy(path, DType::kF32, {16, row_values}, x);
    const auto source = NpySource::from_arrays({{"x", path}});
    for (const bool streaming : {false, true}) {
      FixedWriter writer(static_cast<size_t>(row_values) * 4, streaming);
      EXPECT_EQ(allocations_reading(*source, writer, 16), 0u) << row_values << " " << streaming;
    }
  }
}

// A pass allocates per batch (its bookkeeping, the handed-out tensors), never
// per sample: 65,536 small rows in 16 batches.
TEST(PerSampleCostTest, APassAllocatesPerBatchNotPerSample) {
  constexpr int64_t kRows = 65'536;
  constexpr int64_t kBatch = 4'096;
  const auto source = testing::id_source(kRows);
  LoaderOptions options;
  options.batch_size = kBatch;
  options.shuffle = true;
  options.num_threads = 2;
  // The pressure check reads /proc/meminfo and the cgroup's files on a clock
  // (about 150 allocations a reading): how many fall in a pass depends on how
  // long it runs (52-100 a batch under AddressSanitizer beside a busy CPU),
  // not on its samples. A reading without allocations keeps the count to
  // the loader's own.
  options.available_memory = [] { return size_t{1} << 40; };
  Loader loader(source, options);
  const size_t before = testing::allocation_count();
  {
    auto iterator = loader.iterate();
    Batch batch;
    int64_t batches = 0;
    while (iterator->next(batch, 10s) == EpochIterator::Status::kBatch) ++batches;
    EXPECT_EQ(batches, kRows / kBatch);
  }
  const size_t per_batch = (testing::allocation_count() - before) / (kRows / kBatch);
  // Measured: 23 a batch (its bookkeeping, the two fields' tensors, the
  // run's start spread over 16 batches); one allocation per sample would be
  // over 4,096.
  EXPECT_LE(per_batch, 64u) << "allocations per batch of " << kBatch;
}

}  // namespace
}  // namespace leanloader
