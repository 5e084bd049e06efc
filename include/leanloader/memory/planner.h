// Planner: the training-memory estimator of seed 001 (ai-toolkit's "Memory
// Estimation and Batch Size Calculation"), as one data table and one model.
//
// Units: every figure is in GB as the seed writes them; where bytes are
// converted (trainable parameters, a machine's memory) 1 GB = 2^30 bytes, the
// same base as the seed's per-sample formula (resolution^2 / 1024^2 * 4 GB).
//
// The model (seed 001, "Unified Memory Systems"):
//   reserved  = model weights (by architecture, scaled by quantization)
//             + optimizer states (AdamW: 2 x the model weights)
//             + EMA (1 GB: a LoRA's shadow weights)
//             + differential output preservation (3 GB)
//             + DataLoader workers (8 GB each)
//             + OS reserve (8 GB)
//             - gradient checkpointing savings (30% of the architecture's
//               unquantized weights figure: the seed's "saves ~4-8 GB")
//   available = max(0, total - reserved) * 0.9          (10% safety margin)
//   per sample = resolution^2 / 1024^2 * 4 GB
//   max batch = clamp(floor(available / per sample), 1, cap_max(resolution))
//   initial   = clamp(floor(available / per sample), 1, cap_initial(resolution))
// Discrete GPUs (VRAM separate from RAM) take their batch sizes from the
// seed's VRAM table by resolution instead; the breakdown is still computed
// (without workers and OS reserve, which live in host RAM) so the user sees
// what the training state needs.
//
// Beyond the seed: the optimizer and EMA can be sized from the parameters
// actually trained (TrainingMode::kLora with a rank, kFull, or an explicit
// trainable parameter count) instead of the seed's "2 x the whole model".
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace leanloader {

// One row of the architecture table.
struct ModelArchitecture {
  std::string_view name;   // CLI spelling: sd1, sdxl, flux, qwen_image, ...
  std::string_view label;  // as the seed's table writes it: "Qwen Image"
  // The seed's unified-memory "Base Memory (GB)": weights of every component
  // resident for training (denoiser, VAE, text encoders).
  double weights_gb;
  // Trainable parameters of a LoRA per unit of rank over the denoiser's
  // linear layers (sum of in + out features). An approximation from the
  // published layer shapes; --trainable-params gives an exact count.
  double lora_params_per_rank;
};

enum class Quantization { kNone, k8Bit, k4Bit };

// How the optimizer states and the EMA copy are sized.
enum class TrainingMode {
  kSeed,  // seed 001 literally: AdamW = 2 x model weights, EMA = 1 GB
  kLora,  // from lora_rank x the architecture's LoRA parameters per rank
  kFull,  // full fine-tune: AdamW = 2 x model weights, EMA = model weights
};

struct PlanRequest {
  std::string model = "flux";
  int resolution = 1024;
  // Unified: the whole shared pool. Discrete: the GPU's VRAM.
  double total_memory_gb = 0;
  bool unified = false;
  // DataLoader worker processes; nullopt = recommended_workers().
  std::optional<int> workers;
  bool ema = false;
  bool diff_output_preservation = false;
  bool gradient_checkpointing = false;
  Quantization quantization = Quantization::kNone;
  TrainingMode training = TrainingMode::kSeed;
  int lora_rank = 0;  // required (> 0) with TrainingMode::kLora
  // When > 0, optimizer and EMA are sized from this many parameters whatever
  // the training mode: AdamW keeps two fp32 moments (8 bytes per parameter),
  // EMA one fp32 copy (4 bytes per parameter).
  int64_t trainable_params = 0;
  // Discrete GPUs only: host RAM and CPUs for the worker recommendation
  // (seed: min(floor(RAM / 8 GB), cores, 8)); 0 = unknown, left out of the min.
  double host_memory_gb = 0;
  int cpu_count = 0;
};

// One line of the seed's "Optimizing for this system" list.
struct PlanAdvice {
  std::string action;  // "Disable EMA"
  double saves_gb;     // how much the reserved memory drops
  std::string detail;  // "minor impact", "2 workers x 8 GB", ...
};

struct MemoryPlan {
  bool unified = false;
  double total_memory_gb = 0;
  double model_gb = 0;
  double optimizer_gb = 0;
  double ema_gb = 0;
  double dop_gb = 0;
  double gradient_checkpointing_savings_gb = 0;  // <= 0, included in reserved_gb
  int workers = 0;
  double workers_gb = 0;
  double os_reserve_gb = 0;
  double reserved_gb = 0;
  double available_for_batches_gb = 0;
  double per_sample_gb = 0;
  int max_batch_size = 1;
  int initial_batch_size = 1;
  int recommended_workers = 0;
  int64_t trainable_params = 0;  // 0 when the seed's whole-model charge is used
  std::vector<PlanAdvice> advice;
};

// The seed's calculateRegularizationMemoryCost: GB per option, savings negative.
struct RegularizationCost {
  double ema_gb = 0;
  double diff_output_preservation_gb = 0;
  double gradient_checkpointing_savings_gb = 0;
};

// The seed's batch configuration (BatchConfig).
struct BatchDefaults {
  int batch_size = 1;
  bool auto_scale_batch_size = true;
  int min_batch_size = 1;
  int max_batch_size = 1;
  int batch_size_warmup_steps = 100;
};

class Planner {
 public:
  // The architecture table, in the seed's order.
  static std::span<const ModelArchitecture> architectures();
  // Throws InvalidArgument naming the known architectures.
  static const ModelArchitecture& architecture(std::string_view name);

  // Parses "8bit" / "4bit" / "none" / "" ; throws InvalidArgument otherwise.
  static Quantization parse_quantization(std::string_view text);
  static TrainingMode parse_training_mode(std::string_view text);

  // The full estimate. Throws InvalidArgument for an unknown model, a
  // resolution < 1, total memory < 0 or not finite, negative workers, a
  // kLora request without a positive rank.
  static MemoryPlan plan(const PlanRequest& request);

  // Seed: calculateBatchDefaults.
  static BatchDefaults batch_defaults(const PlanRequest& request);

  // Seed: estimateVRAMUsage: memory in GB for `batch_size` samples, i.e.
  // reserved_gb + batch_size * per_sample_gb of plan(request).
  static double estimate_memory_gb(const PlanRequest& request, int batch_size);

  // Seed: calculateRegularizationMemoryCost (the seed's LoRA figures).
  static RegularizationCost regularization_cost(std::string_view model, bool ema,
                                                bool diff_output_preservation,
                                                bool gradient_checkpointing);

  // Seed: resolution^2 / 1024^2 * 4 GB.
  static double per_sample_gb(int resolution);

  // Seed's worker table. Unified: >= 128 GB -> 4, >= 64 GB -> 2, else 0.
  // Discrete: min(host RAM / 8 GB, cpus, 8) with unknown inputs ignored.
  static int recommended_workers(bool unified, double total_memory_gb, double host_memory_gb = 0,
                                 int cpu_count = 0);
};

// Parses a memory size as the CLI takes it: "120GB", "120" (GB), "64G",
// "96GiB", "512MB", "1.5TB" (binary multiples: 1 GB = 2^30 bytes). Returns GB.
// Throws InvalidArgument for anything else ("auto" is the caller's business).
double parse_memory_size_gb(std::string_view text);

}  // namespace leanloader
