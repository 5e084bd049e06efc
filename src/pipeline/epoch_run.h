// EpochRun: the state of one pass over an epoch, shared by the worker threads
// (as a Job) and the consumer (through EpochIterator). Internal.
//
// Work is claimed from an atomic counter in chunks of rows of one batch (one
// row for large or variable samples, up to 64 KiB of small fixed-size rows),
// so threads balance naturally and small rows do not pay the per-claim
// synchronisation each. A batch may be started only inside the window
// [delivered, delivered + window) (pipeline/prefetch_window.h, at most
// `prefetch`): this bounds the work and memory in flight. The first worker to
// touch a batch takes its slot from the pool; the last worker to finish one of
// its samples finalises it (compaction of skipped rows, tensor views) and
// wakes the consumer. Delivery is in order.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "io/storage_faults.h"
#include "leanloader/core/error.h"
#include "leanloader/pipeline/loader.h"
#include "pipeline/prefetch_window.h"

namespace leanloader::detail {

struct LoaderCounters {
  std::atomic<uint64_t> read_ns{0};
  std::atomic<uint64_t> collate_ns{0};
  std::atomic<uint64_t> consumer_wait_ns{0};
  std::atomic<uint64_t> window_wait_ns{0};
  std::atomic<uint64_t> samples_read{0};
  std::atomic<uint64_t> work_claims{0};  // chunks of rows claimed by worker threads
  std::atomic<uint64_t> samples_skipped{0};
  std::atomic<uint64_t> batches_delivered{0};
  std::atomic<uint64_t> heap_fallback_bytes{0};
  std::atomic<bool> heap_fallback_warned{false};  // the first such sample is told, once
  std::atomic<size_t> batches_in_flight{0};
  // Distinct samples that warned (SampleWriter::warn) since construction.
  std::mutex warned_mutex;
  std::unordered_set<int64_t> warned_samples;
};

// Everything an EpochRun needs from its Loader, fixed for the run.
struct RunPlan {
  std::shared_ptr<const Source> source;
  std::shared_ptr<BatchPool> pool;
  std::shared_ptr<LoaderCounters> counters;
  std::shared_ptr<PrefetchWindow> window;
  LoaderOptions options;
  Sampler sampler;
  uint64_t epoch = 0;
  int64_t num_batches = 0;
  int64_t num_positions = 0;  // samples this rank visits in the run (drop_last trims)
  RankShard shard;            // local position -> position in the epoch's global order
  int prefetch = 1;
  std::vector<size_t> field_offsets;
  std::vector<size_t> row_bytes;
  std::vector<std::string> warnings;  // handed out with the run's first batch
};

class EpochRun final : public Job {
 public:
  explicit EpochRun(RunPlan plan);
  ~EpochRun() override;

  void work(int worker) noexcept override;
  void cancel() noexcept override;

  // The next batch in order. A batch whose every row was skipped
  // (on_error=skip) is not delivered unless sharded over ranks (every rank
  // takes as many steps as the others): the pass goes on to the next one, and
  // its warnings go with the next batch delivered (or to take_warnings() at
  // the end). Called by the one consumer.
  EpochIterator::Status next(Batch& out, std::chrono::milliseconds timeout);
  // Warnings of skipped-whole batches that no later batch carried (the pass
  // ended after them); empties the list.
  std::vector<Warning> take_warnings();
  // See EpochIterator::undo_last_delivery.
  void undo_last_delivery() noexcept { --plan_.counters->batches_delivered; }
  uint64_t epoch() const noexcept { return plan_.epoch; }
  std::vector<SkippedSample> skipped() const;
  uint64_t skipped_count() const noexcept { return skipped_count_.load(); }

 private:
  struct BatchState {
    int64_t batch = -1;
    int64_t first_position = 0;
    int64_t rows = 0;
    std::shared_ptr<Storage> slot;
    std::atomic<int64_t> remaining{0};
    std::atomic<size_t> arena_cursor{0};
    std::vector<int64_t> indices;
    std::vector<uint8_t> skipped;
    std::vector<std::vector<Tensor>> row_tensors;  // collate=list: [row][field]
    std::optional<SampleError> error;              // lowest failing row wins
    std::mutex warnings_mutex;                     // rows warn from several threads
    std::vector<Warning> warnings;
    int64_t error_row = -1;
    bool slot_ready = false;  // the opener has taken (or failed to take) the slot
    bool ready = false;
    Batch result;
  };

  class RowWriter;

  // The first failure outside a sample's read (lowest batch wins): the
  // consumer raises it when it reaches that batch. batch == INT64_MAX: none.
  struct RunFailure {
    int64_t batch = std::numeric_limits<int64_t>::max();
    int64_t position = -1;
    const char* stage = "";
    std::exception_ptr cause;
  };

  bool wait_for_window(int64_t batch);
  void fail_batch(int64_t batch, int64_t position, const char* stage,
                  std::exception_ptr cause) noexcept;
  // Lets the memory-pressure checks move the window; called when a batch is
  // opened (never on the consumer's path).
  void check_pressure();
  BatchState& open_batch(int64_t batch, std::shared_ptr<Storage>& slot_out);
  // Reads rows [first, end) of `batch`. `stage` names what the worker is
  // doing, for an error that escapes.
  void process_chunk(int64_t batch, int64_t first, int64_t end, const char*& stage);
  // When the source reports reads from storage (or, on a pass's first call,
  // its first row is not in memory), announces the rows from `first` on not
  // announced yet, up to kReadAheadBytes past `end`, and, once the first
  // batch has been read, the storage around those after `end`.
  void read_ahead(int64_t first, int64_t end);
  // The sample index this rank visits at its local `position`.
  int64_t index_at(int64_t position) const;
  void record_failure(BatchState& state, int64_t row, SampleError error);
  void finalize(BatchState& state);
  EpochIterator::Status next_in_order(Batch& out, std::chrono::milliseconds timeout);
  void build_stacked(BatchState& state, const std::shared_ptr<Storage>& slot, Batch& result);
  void build_listed(BatchState& state, Batch& result);

  RunPlan plan_;
  pid_t owner_pid_;  // next() and cancel() do nothing safe in a forked child
  Permutation permutation_;
  std::atomic<int64_t> next_chunk_{0};
  int64_t chunk_rows_ = 1;        // rows per claimed chunk
  int64_t chunks_per_batch_ = 1;  // ceil(batch_size / chunk_rows_)
  int64_t read_ahead_rows_ = 16;  // rows announced ahead while reads miss the cache
  std::atomic<uint64_t> storage_reads_seen_{0};
  StorageFaultWatch storage_faults_;      // rows copied from a mapping that was not cached
  std::atomic<int64_t> cold_until_{0};    // announce rows while positions are below this
  std::atomic<int64_t> hinted_until_{0};  // positions below this were announced
  // Positions below this had the storage around them announced; none is
  // until the first batch has been read (see read_ahead).
  std::atomic<int64_t> windows_hinted_until_{0};
  std::atomic<bool> first_batch_read_{false};
  std::atomic<bool> start_probed_{false};  // the pass's first row was asked about (in_memory)
  std::atomic<bool> cancelled_{false};
  std::atomic<int64_t> failed_batch_;
  std::atomic<uint64_t> skipped_count_{0};
  uint64_t max_skipped_ = 0;

  mutable std::mutex mutex_;
  std::condition_variable window_cv_;  // delivered_ advanced, or cancelled
  std::condition_variable ready_cv_;   // a batch became ready, or cancelled
  std::condition_variable slot_cv_;    // a batch's slot was taken
  std::vector<BatchState> ring_;       // prefetch entries, batch b at b % prefetch
  int64_t delivered_ = 0;
  int64_t wait_counted_ = -1;  // the batch whose wait the prefetch window was told of
  bool finished_ = false;
  std::vector<SkippedSample> skipped_;
  RunFailure run_failure_;                       // guarded by mutex_
  std::vector<Warning> carried_warnings_;        // the consumer's (next), of batches not delivered
  std::atomic<bool> source_told_of_end_{false};  // Source::pass_ended called
  void tell_source_pass_ended() noexcept;
};

}  // namespace leanloader::detail
