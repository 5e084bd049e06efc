#include "leanloader/memory/loader_memory_plan.h"

#include <optional>

#include "leanloader/core/checked_size.h"
#include "leanloader/core/error.h"

namespace leanloader {

namespace {

size_t times(size_t count, size_t bytes) {
  const std::optional<size_t> product = checked_mul(count, bytes);
  if (!product) throw InvalidArgument("loader memory plan: the sizes overflow");
  return *product;
}

size_t plus(size_t a, size_t b) {
  const std::optional<size_t> sum = checked_add(a, b);
  if (!sum) throw InvalidArgument("loader memory plan: the sizes overflow");
  return *sum;
}

}  // namespace

LoaderMemoryPlan plan_loader_memory(const LoaderMemoryInput& in) {
  if (in.workers < 0 || in.prefetch < 0 || in.prefetch_to_device < 0) {
    throw InvalidArgument("workers, prefetch and prefetch_to_device must be >= 0");
  }
  if (in.batch_bytes == 0) throw InvalidArgument("a batch of 0 bytes");
  const auto workers = static_cast<size_t>(in.workers);
  const auto prefetch = static_cast<size_t>(in.prefetch);
  const size_t batch = in.batch_bytes;
  const bool pinned = in.pin_memory || in.device;
  LoaderMemoryPlan plan;

  if (workers == 0) {
    const size_t slots = times(plus(prefetch, 2), batch);
    plan.leanloader.push_back({"batch slots (prefetch + 2)", slots, pinned ? slots : 0, 0});
    if (in.device) {
      const size_t blocks = plus(static_cast<size_t>(in.prefetch_to_device), 2);
      plan.leanloader.push_back(
          {"device blocks (prefetch_to_device + 2)", 0, 0, times(blocks, batch)});
    }
  } else {
    // With pin_memory the segments are page-locked where the workers wrote
    // them: the same memory, no copies (dataloader/pin.py). Segments too
    // large to keep live as torch's batches do: those in flight and the one
    // the loop holds. Kept ones (dataloader/batch_segments.py) are also
    // held while free until the next next() offers them, so a worker may
    // meanwhile write into one of its own: measured with 1-2 workers,
    // prefetch 1-4 and a loop holding each batch 50 ms, up to 2 + workers
    // more than those in flight.
    const size_t in_flight = times(prefetch, workers);
    const bool kept = in.batch_bytes <= kKeptBatchSegmentMaxBytes;
    const size_t held = kept ? plus(plus(in_flight, 2), workers) : plus(in_flight, 1);
    const size_t segments = times(held, batch);
    plan.leanloader.push_back({kept ? "batch segments (prefetch x workers + 2 + workers)"
                                    : "batch segments (prefetch x workers + 1)",
                               segments, in.pin_memory ? segments : 0, 0});
    plan.leanloader.push_back({"worker processes", times(workers, in.worker_process_bytes), 0, 0});
    if (in.device)
      plan.leanloader.push_back({"batch on the device (new, old)", 0, 0, times(2, batch)});
  }

  // torch's DataLoader with the same arguments.
  if (workers == 0) {
    plan.torch.push_back({"batch held by the loop", batch, 0, 0});
    if (in.pin_memory) plan.torch.push_back({"pin_memory copy", 0, batch, 0});
  } else {
    const size_t in_flight = plus(times(prefetch, workers), 1);
    plan.torch.push_back({"worker batches (prefetch_factor x workers)",
                          times(times(prefetch, workers), batch), 0, 0});
    plan.torch.push_back({"batch held by the loop", batch, 0, 0});
    if (in.pin_memory) {
      plan.torch.push_back(
          {"pin_memory copies (prefetch_factor x workers + 1)", 0, times(in_flight, batch), 0});
    }
    plan.torch.push_back({"worker processes", times(workers, in.worker_process_bytes), 0, 0});
  }
  if (in.device) plan.torch.push_back({"batch on the device (new, old)", 0, 0, times(2, batch)});
  return plan;
}

MemoryComponent total_of(const std::vector<MemoryComponent>& components) {
  MemoryComponent total{"total", 0, 0, 0};
  for (const MemoryComponent& c : components) {
    // Pinned bytes that are copies (no host figure of their own) add to host.
    const size_t extra_pinned = c.host_bytes == 0 ? c.pinned_bytes : 0;
    total.host_bytes = plus(plus(total.host_bytes, c.host_bytes), extra_pinned);
    total.pinned_bytes = plus(total.pinned_bytes, c.pinned_bytes);
    total.device_bytes = plus(total.device_bytes, c.device_bytes);
  }
  return total;
}

}  // namespace leanloader
