// The estimator against seed 001 (docs "Memory Estimation and Batch Size
// Calculation"): its two worked examples, its discrete table, and further
// cases worked by hand from the seed's formulas.
#include "leanloader/memory/planner.h"

#include <gtest/gtest.h>

#include <cmath>

#include "leanloader/core/error.h"

namespace leanloader {
namespace {

PlanRequest unified(std::string model, int resolution, double total_gb, int workers) {
  PlanRequest request;
  request.model = std::move(model);
  request.resolution = resolution;
  request.total_memory_gb = total_gb;
  request.unified = true;
  request.workers = workers;
  return request;
}

PlanRequest discrete(std::string model, int resolution, double vram_gb) {
  PlanRequest request;
  request.model = std::move(model);
  request.resolution = resolution;
  request.total_memory_gb = vram_gb;
  return request;
}

// Seed: 120 GB unified, Qwen Image, 2048 px, 2 workers, EMA.
TEST(PlannerTest, SeedExampleQwenImage2048On120GbUnified) {
  PlanRequest request = unified("qwen_image", 2048, 120, 2);
  request.ema = true;
  const MemoryPlan plan = Planner::plan(request);
  EXPECT_TRUE(plan.unified);
  EXPECT_DOUBLE_EQ(plan.model_gb, 28);
  EXPECT_DOUBLE_EQ(plan.optimizer_gb, 56);
  EXPECT_DOUBLE_EQ(plan.ema_gb, 1);
  EXPECT_DOUBLE_EQ(plan.dop_gb, 0);
  EXPECT_DOUBLE_EQ(plan.workers_gb, 16);
  EXPECT_DOUBLE_EQ(plan.os_reserve_gb, 8);
  EXPECT_DOUBLE_EQ(plan.reserved_gb, 109);
  EXPECT_NEAR(plan.available_for_batches_gb, 9.9, 1e-9);
  EXPECT_DOUBLE_EQ(plan.per_sample_gb, 16);
  EXPECT_EQ(plan.max_batch_size, 1);  // floor(9.9 / 16) = 0 -> minimum 1
  EXPECT_EQ(plan.initial_batch_size, 1);
  EXPECT_EQ(plan.recommended_workers, 2);  // 64-127 GB
}

// Seed: the same system with 8-bit quantization and 0 workers.
TEST(PlannerTest, SeedExampleQuantized8BitZeroWorkers) {
  PlanRequest request = unified("qwen_image", 2048, 120, 0);
  request.ema = true;
  request.quantization = Quantization::k8Bit;
  const MemoryPlan plan = Planner::plan(request);
  EXPECT_DOUBLE_EQ(plan.model_gb, 14);
  EXPECT_DOUBLE_EQ(plan.optimizer_gb, 28);
  EXPECT_DOUBLE_EQ(plan.ema_gb, 1);
  EXPECT_DOUBLE_EQ(plan.workers_gb, 0);
  EXPECT_DOUBLE_EQ(plan.os_reserve_gb, 8);
  EXPECT_DOUBLE_EQ(plan.reserved_gb, 51);
  EXPECT_NEAR(plan.available_for_batches_gb, 62.1, 1e-9);
  EXPECT_EQ(plan.max_batch_size, 3);      // floor(62.1 / 16)
  EXPECT_EQ(plan.initial_batch_size, 2);  // safety cap > 1536 px
}

// Seed: "Optimizing for this system", in its order and with its figures.
TEST(PlannerTest, SeedExampleAdviceListsTheSeedSavings) {
  PlanRequest request = unified("qwen_image", 2048, 120, 2);
  request.ema = true;
  const MemoryPlan plan = Planner::plan(request);
  ASSERT_GE(plan.advice.size(), 4u);
  EXPECT_EQ(plan.advice[0].action, "Disable EMA");
  EXPECT_DOUBLE_EQ(plan.advice[0].saves_gb, 1);
  EXPECT_EQ(plan.advice[0].detail, "minor impact");
  EXPECT_EQ(plan.advice[1].action, "Use 0 workers");
  EXPECT_DOUBLE_EQ(plan.advice[1].saves_gb, 16);
  EXPECT_EQ(plan.advice[1].detail, "2 workers x 8 GB");
  EXPECT_EQ(plan.advice[2].action, "Enable gradient checkpointing");
  EXPECT_NEAR(plan.advice[2].saves_gb, 8.4, 1e-9);  // seed: "~8GB"
  EXPECT_EQ(plan.advice[3].action, "Enable quantization");
  EXPECT_DOUBLE_EQ(plan.advice[3].saves_gb, 42);  // model 28 -> 14, optimizer 56 -> 28
  EXPECT_NE(plan.advice[3].detail.find("from 28 GB to ~14 GB (8-bit) or ~7 GB (4-bit)"),
            std::string::npos)
      << plan.advice[3].detail;
}

struct DiscreteCase {
  int resolution;
  double vram_gb;
  int initial;
  int max;
};

// Seed's discrete-GPU formula by resolution; max batch = min(cap, 2 x initial).
TEST(PlannerTest, SeedDiscreteTableByResolution) {
  const DiscreteCase cases[] = {
      {512, 24, 8, 16}, {512, 8, 4, 8},   {512, 80, 16, 32}, {768, 24, 6, 12},
      {768, 4, 2, 4},   {768, 48, 8, 16}, {1024, 24, 4, 8},  {1024, 12, 2, 4},
      {1024, 4, 1, 2},  {1536, 24, 2, 4}, {1536, 12, 1, 2},  {2048, 24, 2, 4},
      {2048, 8, 1, 2},  {2048, 80, 2, 4}, {256, 3, 4, 8},    {1025, 80, 2, 4},
  };
  for (const DiscreteCase& c : cases) {
    const MemoryPlan plan = Planner::plan(discrete("flux", c.resolution, c.vram_gb));
    EXPECT_FALSE(plan.unified);
    EXPECT_EQ(plan.initial_batch_size, c.initial) << c.resolution << " px, " << c.vram_gb << " GB";
    EXPECT_EQ(plan.max_batch_size, c.max) << c.resolution << " px, " << c.vram_gb << " GB";
    // Workers and the OS live in host RAM on a discrete machine.
    EXPECT_DOUBLE_EQ(plan.workers_gb, 0);
    EXPECT_DOUBLE_EQ(plan.os_reserve_gb, 0);
  }
}

struct UnifiedCase {
  const char* model;
  int resolution;
  double total_gb;
  int workers;
  Quantization quantization;
  bool ema;
  bool dop;
  bool gradient_checkpointing;
  double reserved_gb;
  int initial;
  int max;
};

// Worked by hand from the seed's formulas (see the comment on each row).
TEST(PlannerTest, UnifiedCasesAcrossArchitecturesResolutionsQuantizationWorkers) {
  const UnifiedCase cases[] = {
      // 24 + 48 + 4 x 8 + 8 = 112; (128 - 112) x 0.9 = 14.4; / 4 GB -> 3
      {"flux", 1024, 128, 4, Quantization::kNone, false, false, false, 112, 3, 3},
      // 14 + 28 + 8 = 50; 14 x 0.9 = 12.6; / 1 GB -> 12 (caps 16 / 32)
      {"sdxl", 512, 64, 0, Quantization::kNone, false, false, false, 50, 12, 12},
      // 2 + 4 - 2.4 + 16 + 8 = 27.6; 36.4 x 0.9 = 32.76; / 2.25 -> 14 (caps 8 / 16)
      {"sd1", 768, 64, 2, Quantization::k4Bit, false, false, true, 27.6, 8, 14},
      // 7 + 14 + 1 + 3 + 8 = 33; 87 x 0.9 = 78.3; / 9 -> 8 (caps 4 / 8)
      {"qwen_image", 1536, 120, 0, Quantization::k4Bit, true, true, false, 33, 4, 8},
      // 20 + 40 + 8 = 68 > 32: nothing left, minimum 1
      {"chroma", 1024, 32, 0, Quantization::kNone, false, false, false, 68, 1, 1},
      // 22 + 44 + 8 + 8 = 82; 174 x 0.9 = 156.6; / 1 -> 156 (caps 16 / 32)
      {"lumina2", 512, 256, 1, Quantization::kNone, false, false, false, 82, 16, 32},
      // 8 + 16 + 1 + 3 - 0.3 x 16 + 0 + 8 = 31.2; 4.8 x 0.9 = 4.32; / 4 -> 1
      {"sd3", 1024, 36, 0, Quantization::k8Bit, true, true, true, 31.2, 1, 1},
      // 12 + 24 + 16 + 8 = 60; 68 x 0.9 = 61.2; / 16 -> 3 (caps 2 / 4)
      {"hidream", 2048, 128, 2, Quantization::k8Bit, false, false, false, 60, 2, 3},
      // 10 + 20 + 8 = 38; 26 x 0.9 = 23.4; / 2.25 -> 10 (caps 8 / 16)
      {"sd2", 768, 64, 0, Quantization::kNone, false, false, false, 38, 8, 10},
  };
  for (const UnifiedCase& c : cases) {
    PlanRequest request = unified(c.model, c.resolution, c.total_gb, c.workers);
    request.quantization = c.quantization;
    request.ema = c.ema;
    request.diff_output_preservation = c.dop;
    request.gradient_checkpointing = c.gradient_checkpointing;
    const MemoryPlan plan = Planner::plan(request);
    EXPECT_NEAR(plan.reserved_gb, c.reserved_gb, 1e-9) << c.model;
    EXPECT_EQ(plan.initial_batch_size, c.initial) << c.model;
    EXPECT_EQ(plan.max_batch_size, c.max) << c.model;
    EXPECT_GE(plan.initial_batch_size, 1);
    EXPECT_LE(plan.initial_batch_size, plan.max_batch_size);
  }
}

TEST(PlannerTest, ArchitectureTableIsTheSeeds) {
  const std::pair<const char*, double> expected[] = {
      {"sd1", 8},      {"sd2", 10},          {"sdxl", 14},     {"sd3", 16},
      {"flux", 24},    {"flux_kontext", 24}, {"flex", 20},     {"chroma", 20},
      {"lumina2", 22}, {"hidream", 24},      {"omnigen2", 24}, {"qwen_image", 28},
  };
  ASSERT_EQ(Planner::architectures().size(), std::size(expected));
  for (size_t i = 0; i < std::size(expected); ++i) {
    EXPECT_EQ(Planner::architectures()[i].name, expected[i].first);
    EXPECT_DOUBLE_EQ(Planner::architecture(expected[i].first).weights_gb, expected[i].second);
  }
  EXPECT_DOUBLE_EQ(Planner::architecture("SDXL").weights_gb, 14);  // case-insensitive
}

TEST(PlannerTest, PerSampleMemoryIsQuadraticInResolution) {
  EXPECT_DOUBLE_EQ(Planner::per_sample_gb(512), 1.0);
  EXPECT_DOUBLE_EQ(Planner::per_sample_gb(768), 2.25);
  EXPECT_DOUBLE_EQ(Planner::per_sample_gb(1024), 4.0);
  EXPECT_DOUBLE_EQ(Planner::per_sample_gb(1536), 9.0);
  EXPECT_DOUBLE_EQ(Planner::per_sample_gb(2048), 16.0);
}

TEST(PlannerTest, RecommendedWorkersByTotalMemory) {
  EXPECT_EQ(Planner::recommended_workers(true, 128), 4);
  EXPECT_EQ(Planner::recommended_workers(true, 512), 4);
  EXPECT_EQ(Planner::recommended_workers(true, 127.9), 2);
  EXPECT_EQ(Planner::recommended_workers(true, 64), 2);
  EXPECT_EQ(Planner::recommended_workers(true, 63.9), 0);
  // Discrete: min(floor(RAM / 8 GB), cores, 8); unknown inputs are left out.
  EXPECT_EQ(Planner::recommended_workers(false, 24, 64, 16), 8);
  EXPECT_EQ(Planner::recommended_workers(false, 24, 24, 2), 2);
  EXPECT_EQ(Planner::recommended_workers(false, 24, 20, 0), 2);
  EXPECT_EQ(Planner::recommended_workers(false, 24, 0, 0), 8);
  EXPECT_EQ(Planner::recommended_workers(false, 24, 4, 32), 0);
}

TEST(PlannerTest, WorkersDefaultToTheRecommendation) {
  PlanRequest request = unified("flux", 1024, 128, 0);
  request.workers.reset();
  const MemoryPlan plan = Planner::plan(request);
  EXPECT_EQ(plan.workers, 4);
  EXPECT_DOUBLE_EQ(plan.workers_gb, 32);
}

TEST(PlannerTest, RegularizationCostMatchesTheSeed) {
  const RegularizationCost qwen = Planner::regularization_cost("qwen_image", true, true, true);
  EXPECT_DOUBLE_EQ(qwen.ema_gb, 1);
  EXPECT_DOUBLE_EQ(qwen.diff_output_preservation_gb, 3);
  EXPECT_NEAR(qwen.gradient_checkpointing_savings_gb, -8.4, 1e-12);
  const RegularizationCost sdxl = Planner::regularization_cost("sdxl", false, false, true);
  EXPECT_DOUBLE_EQ(sdxl.ema_gb, 0);
  EXPECT_DOUBLE_EQ(sdxl.diff_output_preservation_gb, 0);
  EXPECT_NEAR(sdxl.gradient_checkpointing_savings_gb, -4.2, 1e-12);  // seed: "saves ~4-8GB"
  const RegularizationCost none = Planner::regularization_cost("flux", false, false, false);
  EXPECT_DOUBLE_EQ(none.gradient_checkpointing_savings_gb, 0);
}

TEST(PlannerTest, EstimateMemoryIsReservedPlusBatch) {
  PlanRequest request = unified("qwen_image", 2048, 120, 2);
  request.ema = true;
  EXPECT_DOUBLE_EQ(Planner::estimate_memory_gb(request, 1), 109 + 16);
  EXPECT_DOUBLE_EQ(Planner::estimate_memory_gb(request, 0), 109);
  // Discrete: no workers, no OS reserve in VRAM.
  EXPECT_DOUBLE_EQ(Planner::estimate_memory_gb(discrete("flux", 1024, 24), 2), 24 + 48 + 8);
  EXPECT_THROW(Planner::estimate_memory_gb(request, -1), InvalidArgument);
}

TEST(PlannerTest, BatchDefaultsIsTheSeedsBatchConfig) {
  PlanRequest request = unified("qwen_image", 2048, 120, 0);
  request.ema = true;
  request.quantization = Quantization::k8Bit;
  const BatchDefaults defaults = Planner::batch_defaults(request);
  EXPECT_EQ(defaults.batch_size, 2);
  EXPECT_EQ(defaults.max_batch_size, 3);
  EXPECT_EQ(defaults.min_batch_size, 1);
  EXPECT_TRUE(defaults.auto_scale_batch_size);
  EXPECT_EQ(defaults.batch_size_warmup_steps, 100);
}

TEST(PlannerTest, LoraRankSizesOptimizerFromTrainedParameters) {
  PlanRequest request = unified("flux", 1024, 128, 4);
  request.training = TrainingMode::kLora;
  request.lora_rank = 16;
  request.ema = true;
  const MemoryPlan plan = Planner::plan(request);
  const double params = 3.5e6 * 16;
  EXPECT_EQ(plan.trainable_params, static_cast<int64_t>(params));
  EXPECT_NEAR(plan.optimizer_gb, params * 8 / (1u << 30), 1e-9);  // two fp32 moments
  EXPECT_NEAR(plan.ema_gb, params * 4 / (1u << 30), 1e-9);        // one fp32 copy
  EXPECT_DOUBLE_EQ(plan.model_gb, 24);
  // 24 + 0.417 + 0.209 + 32 + 8 = 64.63; 63.37 x 0.9 = 57.0 -> 14 -> caps 4 / 8
  EXPECT_EQ(plan.initial_batch_size, 4);
  EXPECT_EQ(plan.max_batch_size, 8);
  // The seed's whole-model charge: 24 + 48 + 1 + 32 + 8 = 113 -> 13.5 / 4 -> 3.
  PlanRequest seed = request;
  seed.training = TrainingMode::kSeed;
  EXPECT_EQ(Planner::plan(seed).max_batch_size, 3);
}

TEST(PlannerTest, TrainableParamsOverrideAndFullFineTune) {
  PlanRequest request = unified("sdxl", 1024, 128, 0);
  request.trainable_params = 1'000'000'000;
  request.ema = true;
  MemoryPlan plan = Planner::plan(request);
  EXPECT_NEAR(plan.optimizer_gb, 8e9 / (1u << 30), 1e-9);
  EXPECT_NEAR(plan.ema_gb, 4e9 / (1u << 30), 1e-9);

  request.trainable_params = 0;
  request.training = TrainingMode::kFull;
  plan = Planner::plan(request);
  EXPECT_DOUBLE_EQ(plan.optimizer_gb, 28);
  EXPECT_DOUBLE_EQ(plan.ema_gb, 14);  // the whole model duplicated
}

TEST(PlannerTest, RejectsBadRequestsWithTheValues) {
  try {
    Planner::plan(unified("sd4", 1024, 64, 0));
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'sd4'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("qwen_image"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Planner::plan(unified("flux", 0, 64, 0)), InvalidArgument);
  EXPECT_THROW(Planner::plan(unified("flux", 1024, -1, 0)), InvalidArgument);
  EXPECT_THROW(Planner::plan(unified("flux", 1024, NAN, 0)), InvalidArgument);
  EXPECT_THROW(Planner::plan(unified("flux", 1024, 64, -1)), InvalidArgument);
  PlanRequest lora = unified("flux", 1024, 64, 0);
  lora.training = TrainingMode::kLora;
  EXPECT_THROW(Planner::plan(lora), InvalidArgument);
  EXPECT_THROW(Planner::parse_quantization("2bit"), InvalidArgument);
  EXPECT_THROW(Planner::parse_training_mode("dora"), InvalidArgument);
  EXPECT_EQ(Planner::parse_quantization("8BIT"), Quantization::k8Bit);
  EXPECT_EQ(Planner::parse_quantization(""), Quantization::kNone);
  EXPECT_EQ(Planner::parse_training_mode("lora"), TrainingMode::kLora);
}

TEST(PlannerTest, ParsesMemorySizes) {
  EXPECT_DOUBLE_EQ(parse_memory_size_gb("120GB"), 120);
  EXPECT_DOUBLE_EQ(parse_memory_size_gb("120"), 120);
  EXPECT_DOUBLE_EQ(parse_memory_size_gb(" 64 g "), 64);
  EXPECT_DOUBLE_EQ(parse_memory_size_gb("96GiB"), 96);
  EXPECT_DOUBLE_EQ(parse_memory_size_gb("512MB"), 0.5);
  EXPECT_DOUBLE_EQ(parse_memory_size_gb("1.5TB"), 1536);
  for (const char* bad : {"", "abc", "-5", "12XB", "auto", "GB"}) {
    EXPECT_THROW(parse_memory_size_gb(bad), InvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace leanloader
