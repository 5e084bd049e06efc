// Python: the seed-001 estimator (leanloader.planner wraps these).
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include "bindings.h"
#include "leanloader/memory/loader_memory_plan.h"
#include "leanloader/memory/planner.h"

namespace nb = nanobind;

namespace leanloader::bindings {

namespace {

PlanRequest make_request(const std::string& model, int resolution, double total_memory_gb,
                         bool unified, std::optional<int> workers, bool ema,
                         bool diff_output_preservation, bool gradient_checkpointing,
                         const std::string& quantization, const std::string& training,
                         int lora_rank, int64_t trainable_params, double host_memory_gb,
                         int cpu_count) {
  PlanRequest request;
  request.model = model;
  request.resolution = resolution;
  request.total_memory_gb = total_memory_gb;
  request.unified = unified;
  request.workers = workers;
  request.ema = ema;
  request.diff_output_preservation = diff_output_preservation;
  request.gradient_checkpointing = gradient_checkpointing;
  request.quantization = Planner::parse_quantization(quantization);
  request.training = Planner::parse_training_mode(training);
  request.lora_rank = lora_rank;
  request.trainable_params = trainable_params;
  request.host_memory_gb = host_memory_gb;
  request.cpu_count = cpu_count;
  return request;
}

nb::dict plan_to_dict(const MemoryPlan& plan) {
  nb::dict d;
  d["unified"] = plan.unified;
  d["total_memory_gb"] = plan.total_memory_gb;
  d["model_gb"] = plan.model_gb;
  d["optimizer_gb"] = plan.optimizer_gb;
  d["ema_gb"] = plan.ema_gb;
  d["dop_gb"] = plan.dop_gb;
  d["gradient_checkpointing_savings_gb"] = plan.gradient_checkpointing_savings_gb;
  d["workers"] = plan.workers;
  d["workers_gb"] = plan.workers_gb;
  d["os_reserve_gb"] = plan.os_reserve_gb;
  d["reserved_gb"] = plan.reserved_gb;
  d["available_for_batches_gb"] = plan.available_for_batches_gb;
  d["per_sample_gb"] = plan.per_sample_gb;
  d["max_batch_size"] = plan.max_batch_size;
  d["initial_batch_size"] = plan.initial_batch_size;
  d["recommended_workers"] = plan.recommended_workers;
  d["trainable_params"] = plan.trainable_params;
  nb::list advice;
  for (const PlanAdvice& item : plan.advice) {
    nb::dict entry;
    entry["action"] = item.action;
    entry["saves_gb"] = item.saves_gb;
    entry["detail"] = item.detail;
    advice.append(entry);
  }
  d["advice"] = advice;
  return d;
}

}  // namespace

void bind_planner(nb::module_& m) {
  // Every estimator entry point takes the same request keywords.
#define LEANLOADER_PLAN_ARGS                                                                    \
  nb::arg("model"), nb::arg("resolution"), nb::arg("total_memory_gb"), nb::kw_only(),           \
      nb::arg("unified") = false, nb::arg("workers") = nb::none(), nb::arg("ema") = false,      \
      nb::arg("diff_output_preservation") = false, nb::arg("gradient_checkpointing") = false,   \
      nb::arg("quantization") = "none", nb::arg("training") = "seed", nb::arg("lora_rank") = 0, \
      nb::arg("trainable_params") = 0, nb::arg("host_memory_gb") = 0.0, nb::arg("cpu_count") = 0

  m.def(
      "plan_memory",
      [](const std::string& model, int resolution, double total_memory_gb, bool unified,
         std::optional<int> workers, bool ema, bool dop, bool gc, const std::string& quantization,
         const std::string& training, int lora_rank, int64_t trainable_params,
         double host_memory_gb, int cpu_count) {
        return plan_to_dict(Planner::plan(make_request(
            model, resolution, total_memory_gb, unified, workers, ema, dop, gc, quantization,
            training, lora_rank, trainable_params, host_memory_gb, cpu_count)));
      },
      LEANLOADER_PLAN_ARGS,
      "Seed 001's memory model: the breakdown in GB, batch sizes, workers and advice.");

  m.def(
      "batch_defaults",
      [](const std::string& model, int resolution, double total_memory_gb, bool unified,
         std::optional<int> workers, bool ema, bool dop, bool gc, const std::string& quantization,
         const std::string& training, int lora_rank, int64_t trainable_params,
         double host_memory_gb, int cpu_count) {
        const BatchDefaults defaults = Planner::batch_defaults(make_request(
            model, resolution, total_memory_gb, unified, workers, ema, dop, gc, quantization,
            training, lora_rank, trainable_params, host_memory_gb, cpu_count));
        nb::dict d;
        d["batch_size"] = defaults.batch_size;
        d["auto_scale_batch_size"] = defaults.auto_scale_batch_size;
        d["min_batch_size"] = defaults.min_batch_size;
        d["max_batch_size"] = defaults.max_batch_size;
        d["batch_size_warmup_steps"] = defaults.batch_size_warmup_steps;
        return d;
      },
      LEANLOADER_PLAN_ARGS, "Seed 001's calculateBatchDefaults (its BatchConfig).");

  m.def(
      "estimate_memory_gb",
      [](int batch_size, const std::string& model, int resolution, double total_memory_gb,
         bool unified, std::optional<int> workers, bool ema, bool dop, bool gc,
         const std::string& quantization, const std::string& training, int lora_rank,
         int64_t trainable_params, double host_memory_gb, int cpu_count) {
        return Planner::estimate_memory_gb(
            make_request(model, resolution, total_memory_gb, unified, workers, ema, dop, gc,
                         quantization, training, lora_rank, trainable_params, host_memory_gb,
                         cpu_count),
            batch_size);
      },
      nb::arg("batch_size"), LEANLOADER_PLAN_ARGS,
      "Seed 001's estimateVRAMUsage: reserved memory plus batch_size samples, in GB.");
#undef LEANLOADER_PLAN_ARGS

  m.def(
      "regularization_cost",
      [](const std::string& model, bool ema, bool dop, bool gc) {
        const RegularizationCost cost = Planner::regularization_cost(model, ema, dop, gc);
        nb::dict d;
        d["ema_gb"] = cost.ema_gb;
        d["diff_output_preservation_gb"] = cost.diff_output_preservation_gb;
        d["gradient_checkpointing_savings_gb"] = cost.gradient_checkpointing_savings_gb;
        return d;
      },
      nb::arg("model"), nb::arg("ema"), nb::arg("diff_output_preservation"),
      nb::arg("gradient_checkpointing"),
      "Seed 001's calculateRegularizationMemoryCost (GB; savings are negative).");

  m.def(
      "model_architectures",
      [] {
        nb::list out;
        for (const ModelArchitecture& arch : Planner::architectures()) {
          nb::dict d;
          d["name"] = std::string(arch.name);
          d["label"] = std::string(arch.label);
          d["weights_gb"] = arch.weights_gb;
          d["lora_params_per_rank"] = arch.lora_params_per_rank;
          out.append(d);
        }
        return out;
      },
      "The architecture table (seed 001's model weights, in its order).");

  m.def("recommended_workers", &Planner::recommended_workers, nb::arg("unified"),
        nb::arg("total_memory_gb"), nb::arg("host_memory_gb") = 0.0, nb::arg("cpu_count") = 0);
  m.def("per_sample_gb", &Planner::per_sample_gb, nb::arg("resolution"));
  m.attr("KEPT_BATCH_SEGMENT_MAX_BYTES") = kKeptBatchSegmentMaxBytes;
  m.def(
      "plan_loader_memory",
      [](size_t batch_bytes, int workers, int prefetch, bool pin_memory, bool device,
         int prefetch_to_device, size_t worker_process_bytes) {
        LoaderMemoryInput input;
        input.batch_bytes = batch_bytes;
        input.workers = workers;
        input.prefetch = prefetch;
        input.pin_memory = pin_memory;
        input.device = device;
        input.prefetch_to_device = prefetch_to_device;
        input.worker_process_bytes = worker_process_bytes;
        const LoaderMemoryPlan plan = plan_loader_memory(input);
        auto rows = [](const std::vector<MemoryComponent>& components) {
          nb::list out;
          auto row = [](const MemoryComponent& c) {
            nb::dict d;
            d["component"] = c.name;
            d["host_bytes"] = c.host_bytes;
            d["pinned_bytes"] = c.pinned_bytes;
            d["device_bytes"] = c.device_bytes;
            return d;
          };
          for (const MemoryComponent& c : components) out.append(row(c));
          out.append(row(total_of(components)));
          return out;
        };
        nb::dict out;
        out["leanloader"] = rows(plan.leanloader);
        out["torch"] = rows(plan.torch);
        return out;
      },
      nb::arg("batch_bytes"), nb::arg("workers"), nb::arg("prefetch"), nb::arg("pin_memory"),
      nb::arg("device"), nb::arg("prefetch_to_device"), nb::arg("worker_process_bytes"),
      "Host, pinned and device bytes per component of a loader configuration, leanloader's and "
      "torch DataLoader's (the last row of each list is the total).");
  m.def(
      "parse_memory_size_gb", [](const std::string& text) { return parse_memory_size_gb(text); },
      nb::arg("text"),
      "'120GB', '120' (GB), '96GiB', '512MB', '1.5TB' -> GB (1 GB = 2**30 bytes).");
}

}  // namespace leanloader::bindings
