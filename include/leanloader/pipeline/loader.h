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

#include "leanloader/core/tensor.h"
#include "leanloader/pipeline/batch.h"
#include "leanloader/pipeline/batch_pool.h"
#include "leanloader/pipeline/epoch_iterator.h"
#include "leanloader/pipeline/executor.h"
#include "leanloader/pipeline/loader_options.h"
#include "leanloader/pipeline/loader_state.h"
#include "leanloader/pipeline/loader_stats.h"
#include "leanloader/pipeline/sampler.h"
#include "leanloader/pipeline/shard.h"
#include "leanloader/sources/source.h"

namespace leanloader {

namespace detail {
class EpochRun;
struct LoaderCounters;
class PrefetchWindow;
}  // namespace detail

class Loader {
 public:
  // Plans the batch slots. Throws InvalidArgument for impossible options
  // (batch_size < 1, a memory_budget below two slots, stacking a source whose
  // samples have different shapes).
  Loader(std::shared_ptr<const Source> source, LoaderOptions options);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // The source as given, and the immutable snapshot of it that the current
  // (or next) epoch reads (the source itself when it never changes).
  const Source& source() const noexcept { return *source_; }
  const Source& snapshot() const noexcept { return *snapshot_; }
  const LoaderOptions& options() const noexcept { return options_; }

  // The epoch the next iterate() uses; iterate() then advances it by one.
  // A position loaded by load_state() is kept by set_epoch() of its own
  // epoch and dropped by any other (it stays dropped when set back).
  void set_epoch(uint64_t epoch) noexcept;
  uint64_t epoch() const noexcept { return epoch_; }
  // Batches this rank delivers in a whole epoch (from its start).
  int64_t num_batches() const noexcept;

  // Where this loader stands: the epoch of the pass in progress and the
  // global samples consumed in it (every rank is assumed to have taken as
  // many batches as this one, as in lockstep data-parallel training); once a
  // pass ended (or before any), the next epoch at position 0. After
  // load_state() and before the next iterate(), the loaded position.
  LoaderState state() const;
  // Resumes at `state`: sets the epoch, and the next iterate() of that epoch
  // starts at the state's global position, cut into this loader's batches
  // and shared among this loader's world size (which may differ from the
  // saver's). Throws InvalidArgument when the state belongs to another
  // source (fingerprint or size), another order (seed, shuffle), or is
  // malformed. O(1).
  void load_state(const LoaderState& state);

  // Planned bytes: slots x slot_bytes + the source's cache budget + its
  // per-thread scratch for each worker thread (DESIGN.md section 4). A
  // memory_budget caps this whole figure.
  size_t memory_bill() const noexcept { return num_slots_ * slot_bytes_ + source_bytes_; }
  size_t slot_bytes() const noexcept { return slot_bytes_; }
  size_t num_slots() const noexcept { return num_slots_; }
  int effective_prefetch() const noexcept { return prefetch_; }

  // Starts a pass over the current epoch on the worker threads, cancelling a
  // pass still in progress. With follow_updates, first takes the source's
  // current snapshot and sizes the epoch from it; throws InvalidArgument when
  // its fields no longer fit the planned slots (a new Loader is needed).
  // Without (or resuming an epoch), checks the snapshot it keeps is still
  // readable as it was (Source::check_unchanged: an HDF5 file written since
  // is a FormatError).
  std::unique_ptr<EpochIterator> iterate();

  LoaderStats stats() const;

  // Stops the worker threads (idempotent). Returns false when some thread was
  // blocked and had to be detached.
  bool close();

 private:
  RankShard shard_from(uint64_t start) const;
  // Takes `next` as the snapshot of the epochs to come; returns the warning
  // to give when its size differs from the current one.
  std::optional<std::string> adopt_snapshot(std::shared_ptr<const Source> next);

  std::shared_ptr<const Source> source_;
  std::shared_ptr<const Source> snapshot_;  // what epochs read; never changes
  LoaderOptions options_;
  Sampler sampler_;
  std::vector<size_t> field_offsets_;  // collate=stack: byte offset of each field in a slot
  std::vector<size_t> row_bytes_;      // collate=stack: bytes of one sample of each field
  size_t slot_bytes_ = 0;
  size_t num_slots_ = 0;
  size_t source_bytes_ = 0;  // the source's cache budget + its scratch per thread
  int prefetch_ = 0;
  std::shared_ptr<BatchPool> pool_;
  std::shared_ptr<detail::LoaderCounters> counters_;
  std::shared_ptr<detail::PrefetchWindow> window_;
  std::unique_ptr<Executor> executor_;
  std::weak_ptr<detail::EpochRun> current_run_;
  uint64_t epoch_ = 0;
  bool closed_ = false;
  std::string fingerprint_;
  // A loaded position, applied by the next iterate() if it runs this epoch.
  struct Resume {
    uint64_t epoch = 0;
    uint64_t position = 0;
  };
  std::optional<Resume> resume_;
  // The pass started last: its epoch, its shard, and the delivered-batches
  // counter when it started (the counter minus this = batches it delivered).
  struct RunTrack {
    uint64_t epoch = 0;
    RankShard shard;
    uint64_t delivered_before = 0;
  };
  std::optional<RunTrack> last_run_;
  // set_epoch() was called since last_run_ started: the epoch it set is
  // where the loader stands, even if it is the one last_run_ advanced to.
  bool epoch_set_since_last_run_ = false;
};

}  // namespace leanloader
