// LoaderOptions: everything a user chooses about a Loader.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include "leanloader/pipeline/slot_memory_hooks.h"

namespace leanloader {

enum class OnError {
  kRaise,  // stop at the first bad sample and raise its error in the consumer
  kSkip,   // drop bad samples, count them, raise past max_skip_fraction
};

enum class Collate {
  kStack,  // one tensor per field: [rows, *sample shape]; shapes must agree
  kList,   // one tensor per sample per field; shapes may differ
};

struct LoaderOptions {
  int64_t batch_size = 1;
  bool shuffle = false;
  uint64_t seed = 0;
  int num_threads = 2;
  // The most batches prepared ahead of the consumer. With adaptive_prefetch
  // the loader starts one batch ahead and goes deeper only when the consumer
  // waited while threads were held back (pipeline/prefetch_window.h): memory
  // for slots that would gain nothing is never touched.
  int prefetch = 2;
  bool adaptive_prefetch = true;
  // Caps the loader's bill: slots x slot_bytes + the source's cache and
  // per-thread scratch (Loader::memory_bill).
  std::optional<size_t> memory_budget;
  bool drop_last = false;
  // Distributed sharding (see pipeline/shard.h): this process is rank `rank`
  // of `world_size` and visits global batches rank, rank + world_size, ...
  uint64_t rank = 0;
  uint64_t world_size = 1;
  OnError on_error = OnError::kRaise;
  double max_skip_fraction = 0.05;  // of the epoch's samples, with kSkip
  Collate collate = Collate::kStack;
  // Below this many available bytes the loader keeps one batch in flight and
  // gives its spare slots back; above 1.25x it returns to its prefetch depth. Unset:
  // a tenth of the memory this process can use (cgroup-aware).
  std::optional<size_t> pressure_threshold;
  // Where available memory is read from (cgroup-aware MemAvailable by
  // default). Tests and embedders may supply their own reading; it may throw,
  // which the loader reports as an error of the batch being opened.
  std::function<size_t()> available_memory;
  // A source that can change (a TensorCache rebuilt or reloaded, HDF5 files
  // written since they were opened) is read through immutable snapshots.
  // true: each epoch starts on the source's current snapshot (len() changes
  // then, with a warning in the epoch's first batch). false: the Loader keeps
  // the snapshot it was made with (an HDF5 file written since then stops the
  // next pass with a FormatError: its old rows are gone).
  bool follow_updates = true;
  // Sees every batch slot's memory created and freed (page-locking slots in
  // place for a device: device/host_pinning.h). Unset: plain memory.
  std::shared_ptr<SlotMemoryHooks> slot_hooks;
};

// The budget `memory_budget="auto"` stands for: a quarter of the memory
// still available to this process (cgroup-aware), leaving the rest to the
// model and the training loop.
size_t auto_memory_budget();
inline constexpr double kAutoBudgetFraction = 0.25;

}  // namespace leanloader
