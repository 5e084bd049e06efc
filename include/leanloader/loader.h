// Loader: batches from a Source, assembled by native threads into planned
// batch slots and delivered in order.
//
// Data flow: Sampler (order) -> Executor threads (read each sample straight
// into its row of a BatchPool slot) -> in-order delivery to the consumer.
// The memory bill is known at construction: slots x slot_bytes.
//
// Thread-safety: a Loader is driven by one consumer thread (the training
// loop); its worker threads are internal. stats() may be called from any
// thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "leanloader/batch_pool.h"
#include "leanloader/executor.h"
#include "leanloader/sampler.h"
#include "leanloader/source.h"
#include "leanloader/tensor.h"

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
  int prefetch = 2;                     // batches prepared ahead of the consumer
  std::optional<size_t> memory_budget;  // caps slots x slot_bytes
  bool drop_last = false;
  OnError on_error = OnError::kRaise;
  double max_skip_fraction = 0.05;  // of the epoch's samples, with kSkip
  Collate collate = Collate::kStack;
  // Below this many available bytes the loader keeps one batch in flight and
  // gives its spare slots back; above 1.25x it returns to `prefetch`. Unset:
  // a tenth of the memory this process can use (cgroup-aware).
  std::optional<size_t> pressure_threshold;
  // Where available memory is read from (cgroup-aware MemAvailable by
  // default). Tests and embedders may supply their own reading.
  std::function<size_t()> available_memory;
};

// The budget `memory_budget="auto"` stands for: a quarter of the memory
// still available to this process (cgroup-aware), leaving the rest to the
// model and the training loop.
size_t auto_memory_budget();
inline constexpr double kAutoBudgetFraction = 0.25;

// Cumulative counters since construction (times in nanoseconds) plus the
// current occupancy of the pool.
struct LoaderStats {
  uint64_t read_ns = 0;
  uint64_t transform_ns = 0;
  uint64_t collate_ns = 0;
  uint64_t consumer_wait_ns = 0;
  uint64_t samples_read = 0;
  uint64_t samples_skipped = 0;
  uint64_t batches_delivered = 0;
  uint64_t overflow_slots_total = 0;
  uint64_t heap_fallback_bytes = 0;  // collate=list samples that did not fit their slot
  size_t slots_total = 0;
  size_t slots_in_use = 0;
  size_t overflow_slots_in_use = 0;
  size_t batches_in_flight = 0;
  size_t bytes_in_flight = 0;
  size_t slot_bytes = 0;
  size_t planned_bytes = 0;
  size_t resident_bytes = 0;
  int num_threads = 0;
  int prefetch = 0;
  int window = 0;  // batches allowed in flight now (prefetch, or 1 under pressure)
  bool under_pressure = false;
  uint64_t pressure_events = 0;  // times available memory fell below the threshold
  size_t pressure_threshold = 0;
};

struct Batch {
  int64_t batch_index = 0;
  std::vector<int64_t> indices;             // sample indices, skipped ones removed
  std::vector<Tensor> stacked;              // collate=stack: per field
  std::vector<std::vector<Tensor>> listed;  // collate=list: per field, per sample
  std::vector<std::string> warnings;        // surface once to the user
};

// A summary of one skipped sample.
struct SkippedSample {
  int64_t sample_index;
  std::string message;
};

namespace detail {
class EpochRun;
struct LoaderCounters;
struct PressureState;
}  // namespace detail

// One pass over an epoch. Dropping it cancels the remaining work.
class EpochIterator {
 public:
  enum class Status { kBatch, kEnd, kTimeout };

  explicit EpochIterator(std::shared_ptr<detail::EpochRun> run) : run_(std::move(run)) {}
  ~EpochIterator();
  EpochIterator(const EpochIterator&) = delete;
  EpochIterator& operator=(const EpochIterator&) = delete;

  // Waits up to `timeout` for the next batch in order. Rethrows a worker's
  // error (a SampleError with the sample's context) exactly once; after that,
  // and after the last batch, returns kEnd.
  Status next(Batch& out, std::chrono::milliseconds timeout);
  uint64_t epoch() const;
  // Samples dropped so far with on_error=skip (the first 100 in detail).
  std::vector<SkippedSample> skipped() const;
  uint64_t skipped_count() const;
  void cancel();

 private:
  std::shared_ptr<detail::EpochRun> run_;
};

class Loader {
 public:
  // Plans the batch slots. Throws InvalidArgument for impossible options
  // (batch_size < 1, a memory_budget below two slots, stacking a source whose
  // samples have different shapes).
  Loader(std::shared_ptr<const Source> source, LoaderOptions options);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  const Source& source() const noexcept { return *source_; }
  const LoaderOptions& options() const noexcept { return options_; }

  // The epoch the next iterate() uses; iterate() then advances it by one.
  void set_epoch(uint64_t epoch) noexcept { epoch_ = epoch; }
  uint64_t epoch() const noexcept { return epoch_; }
  int64_t num_batches() const noexcept;

  // Planned bytes: slots x slot_bytes (+ per-thread scratch, none yet).
  size_t memory_bill() const noexcept { return num_slots_ * slot_bytes_; }
  size_t slot_bytes() const noexcept { return slot_bytes_; }
  size_t num_slots() const noexcept { return num_slots_; }
  int effective_prefetch() const noexcept { return prefetch_; }

  // Starts a pass over the current epoch on the worker threads, cancelling a
  // pass still in progress.
  std::unique_ptr<EpochIterator> iterate();

  LoaderStats stats() const;

  // Stops the worker threads (idempotent). Returns false when some thread was
  // blocked and had to be detached.
  bool close();

 private:
  std::shared_ptr<const Source> source_;
  LoaderOptions options_;
  Sampler sampler_;
  std::vector<size_t> field_offsets_;  // collate=stack: byte offset of each field in a slot
  std::vector<size_t> row_bytes_;      // collate=stack: bytes of one sample of each field
  size_t slot_bytes_ = 0;
  size_t num_slots_ = 0;
  int prefetch_ = 0;
  std::shared_ptr<BatchPool> pool_;
  std::shared_ptr<detail::LoaderCounters> counters_;
  std::shared_ptr<detail::PressureState> pressure_;
  std::unique_ptr<Executor> executor_;
  std::weak_ptr<detail::EpochRun> current_run_;
  uint64_t epoch_ = 0;
  bool closed_ = false;
};

// Parses "4GiB", "512MB", "1.5 GB", "1024" (bytes). Throws InvalidArgument.
size_t parse_byte_size(const std::string& text);

}  // namespace leanloader
