#include "leanloader/memory/planner.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <sstream>

#include "leanloader/core/error.h"

namespace leanloader {

namespace {

// Seed 001's figures, one table each; the code below only combines them.

// "Model Weights (varies by architecture)", in the seed's order. The LoRA
// column is sum(in + out) over the denoiser's attention and MLP linear layers
// from the published shapes (e.g. Flux: d = 3072, 19 double blocks x 32 d +
// 38 single blocks x 14 d), rounded; it only matters with TrainingMode::kLora.
constexpr std::array<ModelArchitecture, 12> kArchitectures{{
    {"sd1", "SD 1.x", 8, 0.42e6},
    {"sd2", "SD 2.x", 10, 0.43e6},
    {"sdxl", "SDXL", 14, 2.6e6},
    {"sd3", "SD3", 16, 1.3e6},
    {"flux", "Flux", 24, 3.5e6},
    {"flux_kontext", "Flux Kontext", 24, 3.5e6},
    {"flex", "Flex 1/2", 20, 2.4e6},
    {"chroma", "Chroma", 20, 3.5e6},
    {"lumina2", "Lumina 2", 22, 1.0e6},
    {"hidream", "HiDream", 24, 10.0e6},
    {"omnigen2", "OmniGen 2", 24, 1.4e6},
    {"qwen_image", "Qwen Image", 28, 5.9e6},
}};

// One row per resolution band: the discrete-GPU initial batch formula
// (min(max_initial, max(min_initial, floor(VRAM / divisor)))) and the
// "Safety Caps by Resolution" table used on unified memory.
struct ResolutionBand {
  int max_resolution;  // inclusive; the last band has no upper bound
  double discrete_vram_divisor;
  int discrete_min_initial;
  int discrete_max_initial;
  int cap_initial;
  int cap_max;
};

constexpr std::array<ResolutionBand, 5> kResolutionBands{{
    {512, 3, 4, 16, 16, 32},
    {768, 4, 2, 8, 8, 16},
    {1024, 6, 1, 4, 4, 8},
    {1536, 10, 1, 2, 4, 8},
    {0, 12, 1, 2, 2, 4},  // > 1536
}};

// "Reduce DataLoader Workers": total unified memory -> workers.
struct WorkerBand {
  double min_total_gb;
  int workers;
};
constexpr std::array<WorkerBand, 3> kUnifiedWorkerBands{{{128, 4}, {64, 2}, {0, 0}}};

struct QuantizationRow {
  Quantization quantization;
  std::string_view name;
  double weight_factor;  // seed: 28 GB -> ~14 GB (8-bit) or ~7 GB (4-bit)
};
constexpr std::array<QuantizationRow, 3> kQuantizations{{
    {Quantization::kNone, "none", 1.0},
    {Quantization::k8Bit, "8bit", 0.5},
    {Quantization::k4Bit, "4bit", 0.25},
}};

constexpr double kOptimizerWeightFactor = 2.0;  // AdamW: 2 x model weights
constexpr double kEmaLoraGb = 1.0;              // EMA of LoRA weights only
constexpr double kDiffOutputPreservationGb = 3.0;
constexpr double kGradientCheckpointingFraction = 0.3;  // of the architecture's weights figure
constexpr double kWorkerGb = 8.0;
constexpr double kOsReserveGb = 8.0;
constexpr double kSafetyMargin = 0.9;
constexpr double kPerSampleGbAt1024 = 4.0;
constexpr int kDiscreteMaxWorkers = 8;
constexpr double kDiscreteWorkerRamGb = 8.0;
constexpr double kAdamBytesPerParam = 8.0;  // two fp32 moments
constexpr double kEmaBytesPerParam = 4.0;   // one fp32 shadow copy
constexpr double kBytesPerGb = 1024.0 * 1024.0 * 1024.0;
constexpr int kAdviceLoraRank = 32;  // the seed's "typical LoRA (rank 32)"

// floor() that does not lose a whole batch to rounding (11 * 0.9 is
// 9.9000000000000004, 4.5 / 1.5 may land just under 3).
int floor_batches(double available_gb, double per_sample_gb) {
  const double ratio = available_gb / per_sample_gb;
  return static_cast<int>(std::min(1e6, std::floor(ratio + 1e-9)));
}

const ResolutionBand& band_for(int resolution) {
  for (const ResolutionBand& band : kResolutionBands) {
    if (band.max_resolution != 0 && resolution <= band.max_resolution) return band;
  }
  return kResolutionBands.back();
}

double weight_factor(Quantization quantization) {
  for (const QuantizationRow& row : kQuantizations) {
    if (row.quantization == quantization) return row.weight_factor;
  }
  throw InvalidArgument("unknown quantization value " +
                        std::to_string(static_cast<int>(quantization)));
}

std::string format_gb(double gb) {
  std::ostringstream out;
  out.precision(gb == std::floor(gb) ? 0 : 1);
  out << std::fixed << gb << " GB";
  return out.str();
}

std::string lower(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

void validate(const PlanRequest& request) {
  if (request.resolution < 1 || request.resolution > 65536) {
    throw InvalidArgument("resolution must be in [1, 65536], got " +
                          std::to_string(request.resolution));
  }
  if (!std::isfinite(request.total_memory_gb) || request.total_memory_gb < 0) {
    throw InvalidArgument("total memory must be a finite number of GB >= 0, got " +
                          std::to_string(request.total_memory_gb));
  }
  if (request.workers && (*request.workers < 0 || *request.workers > 1024)) {
    throw InvalidArgument("workers must be in [0, 1024], got " + std::to_string(*request.workers));
  }
  if (request.training == TrainingMode::kLora && request.trainable_params == 0 &&
      request.lora_rank <= 0) {
    throw InvalidArgument("LoRA training needs a rank > 0 (or a trainable parameter count), got " +
                          std::to_string(request.lora_rank));
  }
  if (request.lora_rank < 0 || request.lora_rank > 65536) {
    throw InvalidArgument("LoRA rank must be in [0, 65536], got " +
                          std::to_string(request.lora_rank));
  }
  if (request.trainable_params < 0) {
    throw InvalidArgument("trainable parameters must be >= 0, got " +
                          std::to_string(request.trainable_params));
  }
  if (!std::isfinite(request.host_memory_gb) || request.host_memory_gb < 0 ||
      request.cpu_count < 0) {
    throw InvalidArgument("host memory and CPU count must be >= 0, got " +
                          std::to_string(request.host_memory_gb) + " GB and " +
                          std::to_string(request.cpu_count) + " CPUs");
  }
}

// Everything but the advice list (advice re-plans variants of the request).
MemoryPlan plan_core(const PlanRequest& request) {
  validate(request);
  const ModelArchitecture& arch = Planner::architecture(request.model);
  const ResolutionBand& band = band_for(request.resolution);

  MemoryPlan plan;
  plan.unified = request.unified;
  plan.total_memory_gb = request.total_memory_gb;
  plan.recommended_workers = Planner::recommended_workers(
      request.unified, request.total_memory_gb, request.host_memory_gb, request.cpu_count);
  plan.workers = request.workers.value_or(plan.recommended_workers);

  plan.model_gb = arch.weights_gb * weight_factor(request.quantization);

  int64_t trainable = request.trainable_params;
  if (trainable == 0 && request.training == TrainingMode::kLora) {
    trainable = static_cast<int64_t>(std::llround(arch.lora_params_per_rank * request.lora_rank));
  }
  plan.trainable_params = trainable;
  if (trainable > 0) {
    plan.optimizer_gb = static_cast<double>(trainable) * kAdamBytesPerParam / kBytesPerGb;
    plan.ema_gb =
        request.ema ? static_cast<double>(trainable) * kEmaBytesPerParam / kBytesPerGb : 0;
  } else {
    plan.optimizer_gb = plan.model_gb * kOptimizerWeightFactor;
    if (request.ema) {
      plan.ema_gb = request.training == TrainingMode::kFull ? plan.model_gb : kEmaLoraGb;
    }
  }
  plan.dop_gb = request.diff_output_preservation ? kDiffOutputPreservationGb : 0;
  // Activations do not shrink with weight quantization, so the saving is
  // taken from the unquantized figure (qwen_image: 0.3 x 28 = 8.4, the seed's "~8GB").
  plan.gradient_checkpointing_savings_gb =
      request.gradient_checkpointing ? -kGradientCheckpointingFraction * arch.weights_gb : 0;
  // Workers and the OS live in host RAM on a discrete-GPU machine.
  plan.workers_gb = request.unified ? plan.workers * kWorkerGb : 0;
  plan.os_reserve_gb = request.unified ? kOsReserveGb : 0;

  plan.reserved_gb = plan.model_gb + plan.optimizer_gb + plan.ema_gb + plan.dop_gb +
                     plan.gradient_checkpointing_savings_gb + plan.workers_gb + plan.os_reserve_gb;
  plan.available_for_batches_gb =
      std::max(0.0, plan.total_memory_gb - plan.reserved_gb) * kSafetyMargin;
  plan.per_sample_gb = Planner::per_sample_gb(request.resolution);

  if (request.unified) {
    const int fit = floor_batches(plan.available_for_batches_gb, plan.per_sample_gb);
    plan.max_batch_size = std::clamp(fit, 1, band.cap_max);
    plan.initial_batch_size = std::clamp(fit, 1, band.cap_initial);
  } else {
    const int by_vram =
        static_cast<int>(std::floor(request.total_memory_gb / band.discrete_vram_divisor));
    plan.initial_batch_size =
        std::min(band.discrete_max_initial, std::max(band.discrete_min_initial, by_vram));
    plan.max_batch_size = std::min(band.cap_max, plan.initial_batch_size * 2);
  }
  return plan;
}

void add_advice(std::vector<PlanAdvice>& advice, const MemoryPlan& base, const PlanRequest& variant,
                std::string action, std::string detail) {
  const double saves = base.reserved_gb - plan_core(variant).reserved_gb;
  if (saves > 0) advice.push_back({std::move(action), saves, std::move(detail)});
}

std::vector<PlanAdvice> build_advice(const PlanRequest& request, const MemoryPlan& plan) {
  std::vector<PlanAdvice> advice;
  const ModelArchitecture& arch = Planner::architecture(request.model);
  if (request.ema) {
    PlanRequest variant = request;
    variant.ema = false;
    add_advice(advice, plan, variant, "Disable EMA", plan.ema_gb <= 2 ? "minor impact" : "");
  }
  if (request.unified && plan.workers > 0) {
    PlanRequest variant = request;
    variant.workers = 0;
    add_advice(advice, plan, variant, "Use 0 workers",
               std::to_string(plan.workers) + " workers x " + format_gb(kWorkerGb));
  }
  if (!request.gradient_checkpointing) {
    PlanRequest variant = request;
    variant.gradient_checkpointing = true;
    add_advice(advice, plan, variant, "Enable gradient checkpointing",
               "of activation memory, recomputed in the backward pass");
  }
  if (request.quantization != Quantization::k4Bit) {
    PlanRequest variant = request;
    std::string detail;
    if (request.quantization == Quantization::kNone) {
      variant.quantization = Quantization::k8Bit;
      detail = "reduces base model from " + format_gb(arch.weights_gb) + " to ~" +
               format_gb(arch.weights_gb * weight_factor(Quantization::k8Bit)) + " (8-bit) or ~" +
               format_gb(arch.weights_gb * weight_factor(Quantization::k4Bit)) +
               " (4-bit); saving shown for 8-bit";
    } else {
      variant.quantization = Quantization::k4Bit;
      detail = "reduces base model from " + format_gb(plan.model_gb) + " to ~" +
               format_gb(arch.weights_gb * weight_factor(Quantization::k4Bit));
    }
    add_advice(advice, plan, variant,
               request.quantization == Quantization::kNone ? "Enable quantization"
                                                           : "Use 4-bit quantization",
               detail);
  }
  if (request.diff_output_preservation) {
    PlanRequest variant = request;
    variant.diff_output_preservation = false;
    add_advice(advice, plan, variant, "Disable differential output preservation", "");
  }
  if (request.training == TrainingMode::kSeed && request.trainable_params == 0) {
    PlanRequest variant = request;
    variant.training = TrainingMode::kLora;
    variant.lora_rank = kAdviceLoraRank;
    add_advice(advice, plan, variant, "Size the optimizer from the trained parameters",
               "this estimate charges AdamW 2x the whole model; a rank-" +
                   std::to_string(kAdviceLoraRank) + " LoRA trains ~" +
                   std::to_string(static_cast<int64_t>(
                       std::llround(arch.lora_params_per_rank * kAdviceLoraRank / 1e6))) +
                   "M parameters");
  }
  return advice;
}

}  // namespace

std::span<const ModelArchitecture> Planner::architectures() { return kArchitectures; }

const ModelArchitecture& Planner::architecture(std::string_view name) {
  const std::string key = lower(name);
  for (const ModelArchitecture& arch : kArchitectures) {
    if (arch.name == key) return arch;
  }
  std::string known;
  for (const ModelArchitecture& arch : kArchitectures) {
    known += (known.empty() ? "" : ", ") + std::string(arch.name);
  }
  throw InvalidArgument("unknown model architecture '" + std::string(name) + "'; known: " + known);
}

Quantization Planner::parse_quantization(std::string_view text) {
  const std::string key = lower(text);
  if (key.empty()) return Quantization::kNone;
  for (const QuantizationRow& row : kQuantizations) {
    if (row.name == key) return row.quantization;
  }
  throw InvalidArgument("unknown quantization '" + std::string(text) +
                        "'; expected 8bit, 4bit or none");
}

TrainingMode Planner::parse_training_mode(std::string_view text) {
  const std::string key = lower(text);
  if (key.empty() || key == "seed") return TrainingMode::kSeed;
  if (key == "lora") return TrainingMode::kLora;
  if (key == "full") return TrainingMode::kFull;
  throw InvalidArgument("unknown training mode '" + std::string(text) +
                        "'; expected seed, lora or full");
}

MemoryPlan Planner::plan(const PlanRequest& request) {
  MemoryPlan plan = plan_core(request);
  plan.advice = build_advice(request, plan);
  return plan;
}

BatchDefaults Planner::batch_defaults(const PlanRequest& request) {
  const MemoryPlan plan = plan_core(request);
  BatchDefaults defaults;
  defaults.batch_size = plan.initial_batch_size;
  defaults.max_batch_size = plan.max_batch_size;
  return defaults;
}

double Planner::estimate_memory_gb(const PlanRequest& request, int batch_size) {
  if (batch_size < 0) {
    throw InvalidArgument("batch size must be >= 0, got " + std::to_string(batch_size));
  }
  const MemoryPlan plan = plan_core(request);
  return plan.reserved_gb + batch_size * plan.per_sample_gb;
}

RegularizationCost Planner::regularization_cost(std::string_view model, bool ema,
                                                bool diff_output_preservation,
                                                bool gradient_checkpointing) {
  const ModelArchitecture& arch = architecture(model);
  RegularizationCost cost;
  cost.ema_gb = ema ? kEmaLoraGb : 0;
  cost.diff_output_preservation_gb = diff_output_preservation ? kDiffOutputPreservationGb : 0;
  cost.gradient_checkpointing_savings_gb =
      gradient_checkpointing ? -kGradientCheckpointingFraction * arch.weights_gb : 0;
  return cost;
}

double Planner::per_sample_gb(int resolution) {
  if (resolution < 1) {
    throw InvalidArgument("resolution must be >= 1, got " + std::to_string(resolution));
  }
  const double r = resolution;
  return r * r / (1024.0 * 1024.0) * kPerSampleGbAt1024;
}

int Planner::recommended_workers(bool unified, double total_memory_gb, double host_memory_gb,
                                 int cpu_count) {
  if (unified) {
    for (const WorkerBand& band : kUnifiedWorkerBands) {
      if (total_memory_gb >= band.min_total_gb) return band.workers;
    }
    return 0;
  }
  int workers = kDiscreteMaxWorkers;
  if (host_memory_gb > 0) {
    workers =
        std::min(workers, static_cast<int>(std::floor(host_memory_gb / kDiscreteWorkerRamGb)));
  }
  if (cpu_count > 0) workers = std::min(workers, cpu_count);
  return std::max(0, workers);
}

double parse_memory_size_gb(std::string_view text) {
  std::string_view rest = text;
  while (!rest.empty() && std::isspace(static_cast<unsigned char>(rest.front()))) {
    rest.remove_prefix(1);
  }
  while (!rest.empty() && std::isspace(static_cast<unsigned char>(rest.back()))) {
    rest.remove_suffix(1);
  }
  double value = 0;
  const auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), value);
  if (ec != std::errc() || !std::isfinite(value) || value < 0) {
    throw InvalidArgument("cannot parse memory size '" + std::string(text) +
                          "'; expected e.g. 120GB, 120 (GB), 96GiB, 512MB or 1.5TB");
  }
  std::string unit = lower(std::string_view(end, rest.data() + rest.size() - end));
  while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
  if (unit.empty() || unit == "g" || unit == "gb" || unit == "gib") return value;
  if (unit == "t" || unit == "tb" || unit == "tib") return value * 1024.0;
  if (unit == "m" || unit == "mb" || unit == "mib") return value / 1024.0;
  throw InvalidArgument("unknown unit '" + unit + "' in memory size '" + std::string(text) +
                        "'; expected GB, GiB, MB, MiB, TB or TiB");
}

}  // namespace leanloader
