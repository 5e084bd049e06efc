#include "leanloader/memory/loader_memory_plan.h"

#include <gtest/gtest.h>

#include <limits>

#include "leanloader/core/error.h"

namespace leanloader {
namespace {

// Seed 004: batch 32 of fMRI (150 x 150 x 100 float32) + image (3 x 425 x 425
// float32), 4 workers, prefetch factor 2, pin_memory, to an H100.
constexpr size_t kSeed004Batch = size_t{32} * (150 * 150 * 100 * 4 + 3 * 425 * 425 * 4);

TEST(LoaderMemoryPlanTest, Seed004WithTorchsArgumentsByHand) {
  LoaderMemoryInput input;
  input.batch_bytes = kSeed004Batch;
  input.workers = 4;
  input.prefetch = 2;
  input.pin_memory = true;
  input.device = true;
  const LoaderMemoryPlan plan = plan_loader_memory(input);
  const MemoryComponent torch = total_of(plan.torch);
  const size_t worker = 500000000;
  // 8 worker batches + 1 held; 9 pinned copies on top; 4 workers; 2 on the GPU.
  EXPECT_EQ(torch.host_bytes, 8 * kSeed004Batch + kSeed004Batch + 9 * kSeed004Batch + 4 * worker);
  EXPECT_EQ(torch.pinned_bytes, 9 * kSeed004Batch);
  EXPECT_EQ(torch.device_bytes, 2 * kSeed004Batch);
  // ll.DataLoader: the same 9 batches in flight, page-locked in place: no copies.
  const MemoryComponent ours = total_of(plan.leanloader);
  EXPECT_EQ(ours.host_bytes, 9 * kSeed004Batch + 4 * worker);
  EXPECT_EQ(ours.pinned_bytes, 9 * kSeed004Batch);
  EXPECT_EQ(ours.device_bytes, 2 * kSeed004Batch);
  // 357 MB per batch as the seed computes it (288 MB + 69 MB): 32 x 11,167,500 bytes.
  EXPECT_EQ(kSeed004Batch, 357360000u);
}

TEST(LoaderMemoryPlanTest, NativeThreadsPinTheirSlotsInPlace) {
  LoaderMemoryInput input;
  input.batch_bytes = 1000;
  input.prefetch = 2;
  input.device = true;
  input.prefetch_to_device = 1;
  const LoaderMemoryPlan plan = plan_loader_memory(input);
  const MemoryComponent ours = total_of(plan.leanloader);
  EXPECT_EQ(ours.host_bytes, 4000u);    // prefetch + 2 slots
  EXPECT_EQ(ours.pinned_bytes, 4000u);  // the same memory, page-locked
  EXPECT_EQ(ours.device_bytes, 3000u);  // prefetch_to_device + 2 blocks
}

TEST(LoaderMemoryPlanTest, KeptBatchSegmentsAreBilledWithThoseBeingReplaced) {
  // Batches small enough to keep their segments for reuse: in flight, the
  // two a loop holds across next(), one per worker of its own (measured: up
  // to 12 segments with 2 workers, prefetch 4, 4 MiB batches; 9 had been
  // billed). Larger batches live as torch's do: in flight + 1.
  LoaderMemoryInput input;
  input.workers = 2;
  input.prefetch = 4;
  input.worker_process_bytes = 0;
  input.batch_bytes = size_t{4} << 20;
  EXPECT_EQ(total_of(plan_loader_memory(input).leanloader).host_bytes, 12 * input.batch_bytes);
  input.batch_bytes = kKeptBatchSegmentMaxBytes + 1;
  EXPECT_EQ(total_of(plan_loader_memory(input).leanloader).host_bytes, 9 * input.batch_bytes);
}

TEST(LoaderMemoryPlanTest, BadNumbersAreErrors) {
  LoaderMemoryInput input;
  input.batch_bytes = std::numeric_limits<size_t>::max() / 2;
  EXPECT_THROW(plan_loader_memory(input), InvalidArgument);
  input.batch_bytes = 10;
  input.workers = -1;
  EXPECT_THROW(plan_loader_memory(input), InvalidArgument);
  input.workers = 0;
  input.batch_bytes = 0;
  EXPECT_THROW(plan_loader_memory(input), InvalidArgument);
}

}  // namespace
}  // namespace leanloader
