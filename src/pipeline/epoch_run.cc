#include "pipeline/epoch_run.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <utility>

#include "io/streaming_copy.h"
#include "leanloader/core/checked_size.h"
#include "leanloader/core/error.h"

namespace leanloader::detail {

namespace {

using Clock = std::chrono::steady_clock;

uint64_t elapsed_ns(Clock::time_point since) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - since).count());
}

// Advances `until` to `target` unless another thread got it further already;
// returns where it stood (the positions from there to `target` are the
// caller's to announce, none if it stood at or past `target`).
int64_t advance_to(std::atomic<int64_t>& until, int64_t target) {
  int64_t from = until.load();
  while (from < target && !until.compare_exchange_weak(from, target)) {
  }
  return from;
}

constexpr size_t kSkippedDetailLimit = 100;
// How long a worker waits for a slot to come back before allocating beyond
// the pool: the consumer drops its previous batch right after it receives
// the next one, so a short wait avoids overflowing the planned memory.
constexpr std::chrono::milliseconds kSlotPatience(100);
// Work is claimed in chunks of rows of one batch. Per claim a worker takes
// the run's mutex twice (prefetch window, batch entry), copies the slot's
// shared_ptr, reads the clock twice and updates shared counters: ~0.3 us, as
// much as copying a 4 KiB row. A chunk holds up to kChunkBytes of rows.
constexpr size_t kChunkBytes = size_t{64} << 10;
constexpr int64_t kMaxChunkRows = 64;
// Rows not in the page cache: the rows of the next kReadAheadBytes are
// announced to the source (Source::will_need), so that the kernel reads many
// at once instead of one per thread (2 threads, random 256 KiB rows of a
// 2 GiB file, evicted: 1.25 GB/s with one read per thread; fio on this disk:
// 1.13 GB/s at 2 reads in flight, 1.77 at 64).
constexpr size_t kReadAheadBytes = size_t{32} << 20;

}  // namespace

// Hands a Source the destinations of one sample's fields inside the batch
// slot: its row for collate=stack, a bump-allocated range for collate=list
// (or a heap block when the slot's arena is full).
class EpochRun::RowWriter final : public SampleWriter {
 public:
  RowWriter(EpochRun& run, BatchState& state, const std::shared_ptr<Storage>& slot, int64_t row)
      : run_(run), state_(state), slot_(slot), row_(row) {}

  SampleContext context() const override { return {run_.plan_.options.seed, run_.plan_.epoch}; }

  void warn(Warning warning) override {
    LoaderCounters& counters = *run_.plan_.counters;
    {
      std::lock_guard lock(counters.warned_mutex);
      counters.warned_samples.insert(state_.indices[static_cast<size_t>(row_)]);
    }
    std::lock_guard lock(state_.warnings_mutex);
    state_.warnings.push_back(std::move(warning));
  }

  bool prefers_streaming_stores() const override {
    return slot_->size() >= detail::streaming_batch_bytes();
  }

  std::span<std::byte> field_buffer(size_t field, const Shape& shape) override {
    const auto& fields = run_.plan_.source->fields();
    if (field >= fields.size()) {
      throw InvalidArgument("source wrote field #" + std::to_string(field) + " but has only " +
                            std::to_string(fields.size()));
    }
    written_mask_ |= uint64_t{1} << (field % 64);
    const FieldSpec& spec = fields[field];
    const bool stack = run_.plan_.options.collate == Collate::kStack;
    if (stack && spec.shape.has_value() && shape == *spec.shape) {
      // The batch's own row: its size was checked when the loader was planned.
      std::byte* row = slot_->data() + run_.plan_.field_offsets[field] +
                       static_cast<size_t>(row_) * run_.plan_.row_bytes[field];
      return {row, run_.plan_.row_bytes[field]};
    }
    const std::optional<size_t> checked_bytes = checked_nbytes(shape, spec.dtype);
    if (!checked_bytes) {
      throw InvalidArgument("field '" + spec.name + "': " + std::string(dtype_name(spec.dtype)) +
                            " " + shape_to_string(shape) +
                            " has no whole byte size (overflow, or sub-byte elements that do "
                            "not end on a byte boundary)");
    }
    const size_t bytes = *checked_bytes;
    if (stack) {
      throw InvalidArgument("field '" + spec.name + "' has shape " + shape_to_string(shape) +
                            " in this sample but " +
                            (spec.shape ? shape_to_string(*spec.shape) : std::string("varies")) +
                            " in the batch; pass collate='list' for samples of different shapes");
    }
    // collate=list: take the next aligned range of the slot's arena.
    const std::optional<size_t> reserved =
        checked_round_up(std::max<size_t>(bytes, 1), kBufferAlignment);
    // A sample larger than the whole slot never takes from the arena, so the
    // cursor cannot wrap; the heap allocation reports what cannot be had.
    const bool fits_a_slot = reserved && *reserved <= slot_->size();
    const size_t offset = fits_a_slot ? state_.arena_cursor.fetch_add(*reserved) : 0;
    Tensor tensor;
    if (fits_a_slot && range_fits(offset, *reserved, slot_->size())) {
      tensor = Tensor(slot_, offset, spec.dtype, shape);
    } else {
      LoaderCounters& counters = *run_.plan_.counters;
      counters.heap_fallback_bytes += bytes;
      tensor = Tensor(HeapStorage::allocate(bytes), 0, spec.dtype, shape);
      if (!counters.heap_fallback_warned.exchange(true)) warn_heap_fallback(spec, bytes);
    }
    state_.row_tensors[static_cast<size_t>(row_)][field] = tensor;
    return {tensor.data(), bytes};
  }

  // A sample of collate='list' that does not fit what is left of its batch
  // slot is held outside the planned memory: said once per loader, since
  // the bill and the budget cannot count it (stats() counts them all).
  void warn_heap_fallback(const FieldSpec& spec, size_t bytes) {
    const int64_t index = state_.indices[static_cast<size_t>(row_)];
    const std::string location = run_.plan_.source->sample_location(index);
    std::lock_guard lock(state_.warnings_mutex);
    state_.warnings.push_back(
        "sample " + std::to_string(index) + (location.empty() ? "" : " ('" + location + "')") +
        ": field '" + spec.name + "' takes " + std::to_string(bytes) +
        " bytes, more than is left of its batch slot of " + std::to_string(slot_->size()) +
        " bytes (planned from " + std::to_string(run_.plan_.source->estimated_sample_bytes()) +
        " bytes per sample: sizes vary with collate='list'); it is held outside the planned "
        "memory, which memory_bill() and memory_budget do not count. Later such samples are "
        "counted in stats()['heap_fallback_bytes'], without a warning.");
  }

  // Checks that the source gave every field (a source bug otherwise).
  void check_complete() const {
    const size_t count = run_.plan_.source->fields().size();
    const uint64_t expected = count >= 64 ? ~uint64_t{0} : (uint64_t{1} << count) - 1;
    if ((written_mask_ & expected) != expected) {
      throw Error("the source did not produce every field of the sample");
    }
  }

 private:
  EpochRun& run_;
  BatchState& state_;
  const std::shared_ptr<Storage>& slot_;
  int64_t row_;
  uint64_t written_mask_ = 0;
};

EpochRun::EpochRun(RunPlan plan)
    : plan_(std::move(plan)),
      owner_pid_(::getpid()),
      permutation_(plan_.sampler.permutation(plan_.epoch)),
      failed_batch_(std::numeric_limits<int64_t>::max()),
      ring_(static_cast<size_t>(plan_.prefetch)) {
  // Rows claimed at a time: up to kChunkBytes of fixed-size rows, at most
  // kMaxChunkRows, and at most a quarter of a batch so that threads still
  // share one. Large or variable samples go one at a time, as before.
  size_t row_bytes = 0;
  for (const size_t bytes : plan_.row_bytes) row_bytes += bytes;
  const int64_t batch_size = plan_.options.batch_size;
  int64_t rows = 1;
  if (plan_.options.collate == Collate::kStack && row_bytes > 0) {
    rows = static_cast<int64_t>(std::max<size_t>(kChunkBytes / row_bytes, 1));
  }
  chunk_rows_ =
      std::clamp<int64_t>(std::min(rows, kMaxChunkRows), 1, std::max<int64_t>(batch_size / 4, 1));
  chunks_per_batch_ = (batch_size + chunk_rows_ - 1) / chunk_rows_;
  storage_reads_seen_ = plan_.source->storage_reads();  // misses of earlier passes are old news
  read_ahead_rows_ =
      row_bytes > 0 ? static_cast<int64_t>(std::clamp<size_t>(kReadAheadBytes / row_bytes, 1, 1024))
                    : 16;
  if (plan_.options.on_error == OnError::kSkip) {
    max_skipped_ = static_cast<uint64_t>(plan_.options.max_skip_fraction *
                                         static_cast<double>(plan_.num_positions));
  }
}

EpochRun::~EpochRun() {
  for (const BatchState& state : ring_) {
    if (state.batch >= 0) --plan_.counters->batches_in_flight;
  }
}

void EpochRun::tell_source_pass_ended() noexcept {
  if (!source_told_of_end_.exchange(true)) plan_.source->pass_ended();
}

void EpochRun::cancel() noexcept {
  if (::getpid() != owner_pid_) return;  // a forked child: the parent's run is not ours
  // Workers still reading (a pass left early) reopen what the source closes.
  tell_source_pass_ended();
  {
    std::lock_guard lock(mutex_);
    cancelled_ = true;
    // Give back the slots of undelivered batches now, so that a new pass can
    // reuse them: a worker still writing a sample holds its own reference,
    // and finalize() works on its own copy.
    for (BatchState& state : ring_) {
      state.slot.reset();
      state.result = Batch{};
    }
  }
  window_cv_.notify_all();
  ready_cv_.notify_all();
  slot_cv_.notify_all();
}

void EpochRun::work(int /*worker*/) noexcept {
  const int64_t batch_size = plan_.options.batch_size;
  while (!cancelled_.load(std::memory_order_relaxed)) {
    // Chunk c is rows [j * chunk_rows_, (j + 1) * chunk_rows_) of batch
    // c / chunks_per_batch_ (j = c % chunks_per_batch_): a chunk never spans
    // two batches.
    const int64_t chunk = next_chunk_.fetch_add(1);
    const int64_t batch = chunk / chunks_per_batch_;
    if (batch >= plan_.num_batches) return;
    const int64_t first = batch * batch_size + (chunk % chunks_per_batch_) * chunk_rows_;
    const int64_t end =
        std::min({first + chunk_rows_, (batch + 1) * batch_size, plan_.num_positions});
    if (first >= end) continue;  // past the rows of a short last batch
    if (batch > failed_batch_.load())
      return;  // an earlier batch failed; nothing after it is needed
    // Whatever escapes the per-sample handling (reading available memory,
    // allocating a batch's bookkeeping, finalising it) fails the batch for
    // the consumer; nothing reaches the thread's noexcept boundary.
    const char* stage = "wait for the prefetch window";
    try {
      if (!wait_for_window(batch)) return;
      process_chunk(batch, first, end, stage);
    } catch (...) {
      fail_batch(batch, first, stage, std::current_exception());
      return;
    }
  }
}

void EpochRun::fail_batch(int64_t batch, int64_t position, const char* stage,
                          std::exception_ptr cause) noexcept {
  {
    std::lock_guard lock(mutex_);
    if (batch < run_failure_.batch) run_failure_ = {batch, position, stage, std::move(cause)};
  }
  int64_t failed = failed_batch_.load();
  while (batch < failed && !failed_batch_.compare_exchange_weak(failed, batch)) {
  }
  ready_cv_.notify_all();
  window_cv_.notify_all();
}

bool EpochRun::wait_for_window(int64_t batch) {
  std::unique_lock lock(mutex_);
  const auto inside = [&] {
    return cancelled_.load() || batch < delivered_ + plan_.window->window();
  };
  if (inside()) return !cancelled_.load();
  const auto started = Clock::now();
  window_cv_.wait(lock, inside);
  plan_.counters->window_wait_ns += elapsed_ns(started);
  return !cancelled_.load();
}

EpochRun::BatchState& EpochRun::open_batch(int64_t batch, std::shared_ptr<Storage>& slot_out) {
  std::unique_lock lock(mutex_);
  BatchState& state = ring_[static_cast<size_t>(batch % plan_.prefetch)];
  if (state.batch == batch) {
    // Another worker opened it; wait until its slot is there.
    slot_cv_.wait(lock, [&] { return state.slot_ready || cancelled_.load(); });
    // Each writer holds its own reference: the slot cannot return to the pool
    // while a sample is still being written into it, even if the run is
    // cancelled meanwhile.
    slot_out = state.slot;
    return state;
  }
  // This worker opens the batch. The entry last held batch - prefetch, which
  // the window guarantees was delivered (moved out) already.
  const int64_t batch_size = plan_.options.batch_size;
  const int64_t first_position = batch * batch_size;
  const int64_t rows = std::min(batch_size, plan_.num_positions - first_position);
  // What may throw (allocation) comes before the entry is claimed for this
  // batch: a worker that finds state.batch == batch relies on the entry being
  // complete. Until then the entry still belongs to a batch already delivered.
  state.indices.assign(static_cast<size_t>(rows), -1);
  state.skipped.assign(static_cast<size_t>(rows), 0);
  if (plan_.options.collate == Collate::kList) {
    state.row_tensors.resize(static_cast<size_t>(rows));
    for (auto& row : state.row_tensors) row.assign(plan_.source->fields().size(), Tensor());
  }
  state.batch = batch;
  state.first_position = first_position;
  state.rows = rows;
  state.remaining = rows;
  state.arena_cursor = 0;
  state.error.reset();
  state.error_row = -1;
  state.slot_ready = false;
  state.ready = false;
  state.result = Batch{};
  ++plan_.counters->batches_in_flight;
  lock.unlock();

  // Take the slot outside the lock: it may wait for the consumer to drop a
  // batch, and the consumer must not be blocked meanwhile.
  std::shared_ptr<Storage> slot;
  std::optional<SampleError> failure;
  try {
    slot = plan_.pool->acquire(kSlotPatience, static_cast<size_t>(plan_.window->window()) + 1);
  } catch (...) {
    failure = make_sample_error(index_at(state.first_position), plan_.source->describe(), "",
                                "allocate batch slot", std::current_exception());
  }
  lock.lock();
  if (failure) {
    state.error = std::move(failure);
    state.error_row = 0;
    failed_batch_ = std::min(failed_batch_.load(), batch);
  }
  if (!cancelled_.load()) state.slot = slot;  // cancel() gave the ring's slots back already
  state.slot_ready = true;
  slot_out = std::move(slot);
  lock.unlock();
  slot_cv_.notify_all();
  return state;
}

void EpochRun::check_pressure() {
  if (plan_.window->check(*plan_.pool)) window_cv_.notify_all();
}

void EpochRun::process_chunk(int64_t batch, int64_t first, int64_t end, const char*& stage) {
  stage = "check memory pressure";
  if (first % plan_.options.batch_size == 0) check_pressure();
  stage = "open batch";
  std::shared_ptr<Storage> slot;
  BatchState& state = open_batch(batch, slot);
  const int64_t count = end - first;
  stage = "read ahead";
  read_ahead(first, end);
  stage = "read";
  const auto started = Clock::now();
  // Each row's sample is told to the source one row ahead (will_read), so
  // that its first bytes are on their way to the cache while this row is
  // copied: rows of a shuffled pass lie on unrelated pages, where the
  // hardware's prefetchers cannot see them coming.
  int64_t next_index = first < end ? index_at(first) : 0;
  for (int64_t position = first; position < end; ++position) {
    const int64_t row = position - state.first_position;
    const int64_t index = next_index;
    if (position + 1 < end) {
      next_index = index_at(position + 1);
      plan_.source->will_read(next_index);
    }
    state.indices[static_cast<size_t>(row)] = index;
    // Without a slot (its allocation failed: the batch's error) nothing is read.
    if (slot == nullptr) continue;
    try {
      RowWriter writer(*this, state, slot, row);
      plan_.source->read_sample(index, writer);
      writer.check_complete();
    } catch (...) {
      record_failure(
          state, row,
          make_sample_error(index, plan_.source->describe(), plan_.source->sample_location(index),
                            "read", std::current_exception()));
    }
  }
  // Shared counters once per chunk, not per sample: threads would otherwise
  // take turns owning their cache line.
  if (slot != nullptr) {
    plan_.counters->read_ns += elapsed_ns(started);
    plan_.counters->samples_read += static_cast<uint64_t>(count);
  }
  ++plan_.counters->work_claims;
  stage = "finalize batch";
  if (state.remaining.fetch_sub(count) == count) {
    first_batch_read_.store(true, std::memory_order_release);
    finalize(state);
  }
}

void EpochRun::read_ahead(int64_t first, int64_t end) {
  // The pass's first call asks whether its first row is in memory: a cold
  // pass then announces its first rows before reading any. Otherwise a miss
  // shows only after a chunk has been read, and rows copied out of a mapping
  // each fault in the device's read-ahead around them (8 MiB on this disk),
  // one at a time per thread (cold 2 GiB of 4 KiB rows, batch 4,096: the
  // first chunks' 16-row faults took most of a 0.6-0.8 s first batch).
  const bool cold_start = !start_probed_.load(std::memory_order_relaxed) &&
                          !start_probed_.exchange(true, std::memory_order_relaxed) &&
                          !plan_.source->in_memory(index_at(first));
  const uint64_t storage_reads = plan_.source->storage_reads();
  const bool read_from_storage =
      storage_reads != storage_reads_seen_.load(std::memory_order_relaxed);
  // Rows copied out of a mapping are not counted by the source; their page
  // faults are (this thread's, checked every few chunks).
  if (storage_faults_.faulted_since_last_check() || read_from_storage || cold_start) {
    // Rows are coming from storage: keep announcing the next rows until
    // several windows' worth have been read without another miss.
    storage_reads_seen_.store(storage_reads, std::memory_order_relaxed);
    cold_until_.store(end + 4 * read_ahead_rows_, std::memory_order_relaxed);
  }
  if (end >= cold_until_.load(std::memory_order_relaxed)) return;
  const int64_t target = std::min(end + read_ahead_rows_, plan_.num_positions);
  int64_t from = advance_to(hinted_until_, target);
  for (int64_t position = std::max(from, first); position < target; ++position) {
    plan_.source->will_need(index_at(position));
  }
  // Then the storage around those rows: the rows come first, so that a
  // batch waits for its own rows, not for the windows around them. (Capping
  // the windows a call announces, so that a thread would not wait in the
  // kernel for the device's queue, lost a quarter of the throughput.) Not
  // before the first batch has been read: the windows around the next rows
  // fill the device's queue (128 windows of 8 MiB on a disk reading ahead
  // 8 MiB), and the first batch's own reads waited behind them (a cold
  // 2 GiB file of 256 KiB rows, batch 64: first batch 0.6-1.1 s, 0.04-0.06 s
  // without them).
  if (!first_batch_read_.load(std::memory_order_acquire)) return;
  from = advance_to(windows_hinted_until_, target);
  for (int64_t position = std::max(from, end); position < target; ++position) {
    plan_.source->will_need_around(index_at(position));
  }
}

int64_t EpochRun::index_at(int64_t position) const {
  const uint64_t global = plan_.shard.order_position(static_cast<uint64_t>(position));
  return static_cast<int64_t>(plan_.options.shuffle ? permutation_(global) : global);
}

void EpochRun::record_failure(BatchState& state, int64_t row, SampleError error) {
  const int64_t batch = state.batch;
  if (plan_.options.on_error == OnError::kSkip) {
    state.skipped[static_cast<size_t>(row)] = 1;
    const uint64_t count = ++skipped_count_;
    ++plan_.counters->samples_skipped;
    std::lock_guard lock(mutex_);
    if (skipped_.size() < kSkippedDetailLimit) {
      skipped_.push_back({error.sample_index(), error.what()});
    }
    if (count <= max_skipped_) return;
    // Past the allowed fraction: the skip becomes the batch's error.
    const std::string message =
        std::to_string(count) + " samples skipped in epoch " + std::to_string(plan_.epoch) +
        ", more than max_skip_fraction=" + std::to_string(plan_.options.max_skip_fraction) +
        " of " + std::to_string(plan_.num_positions) + "; last: " + error.cause();
    if (!state.error || row < state.error_row) {
      state.error = SampleError(error.sample_index(), error.source(), error.location(),
                                error.stage(), message, error.kind());
      state.error_row = row;
    }
    failed_batch_ = std::min(failed_batch_.load(), batch);
    return;
  }
  std::lock_guard lock(mutex_);
  if (!state.error || row < state.error_row) {
    state.error = std::move(error);
    state.error_row = row;
  }
  failed_batch_ = std::min(failed_batch_.load(), batch);
}

void EpochRun::finalize(BatchState& state) {
  const auto started = Clock::now();
  std::shared_ptr<Storage> slot;
  {
    std::lock_guard lock(mutex_);
    slot = state.slot;
  }
  Batch result;
  if (!state.error && slot != nullptr) {
    try {
      if (plan_.options.collate == Collate::kStack) {
        build_stacked(state, slot, result);
      } else {
        build_listed(state, result);
      }
    } catch (...) {
      state.error =
          make_sample_error(state.indices.empty() ? -1 : state.indices[0], plan_.source->describe(),
                            "", "collate", std::current_exception());
    }
  }
  if (state.batch == 0) {
    result.warnings.insert(result.warnings.end(), plan_.warnings.begin(), plan_.warnings.end());
  }
  {
    std::lock_guard lock(state.warnings_mutex);
    for (Warning& warning : state.warnings) result.warnings.push_back(std::move(warning));
    state.warnings.clear();
  }
  if (auto warning = plan_.window->take_warning()) result.warnings.push_back(*warning);
  if (plan_.pool->take_overflow_warning()) {
    result.warnings.push_back(
        "the consumer holds more batches than the loader's " +
        std::to_string(plan_.pool->num_slots()) +
        " batch slots; allocating beyond the planned memory. Release batches sooner or raise "
        "prefetch/memory_budget.");
  }
  plan_.counters->collate_ns += elapsed_ns(started);
  {
    std::lock_guard lock(mutex_);
    if (!cancelled_) state.result = std::move(result);
    state.ready = true;
  }
  ready_cv_.notify_all();
}

void EpochRun::build_stacked(BatchState& state, const std::shared_ptr<Storage>& slot,
                             Batch& result) {
  const auto& fields = plan_.source->fields();
  int64_t kept = 0;
  for (int64_t row = 0; row < state.rows; ++row) {
    if (state.skipped[static_cast<size_t>(row)]) continue;
    if (kept != row) {
      // Compact: move the row down over the skipped ones (rare path).
      for (size_t f = 0; f < fields.size(); ++f) {
        std::byte* base = slot->data() + plan_.field_offsets[f];
        std::memmove(base + static_cast<size_t>(kept) * plan_.row_bytes[f],
                     base + static_cast<size_t>(row) * plan_.row_bytes[f], plan_.row_bytes[f]);
      }
    }
    result.indices.push_back(state.indices[static_cast<size_t>(row)]);
    ++kept;
  }
  for (size_t f = 0; f < fields.size(); ++f) {
    Shape shape{kept};
    shape.insert(shape.end(), fields[f].shape->begin(), fields[f].shape->end());
    result.stacked.emplace_back(slot, plan_.field_offsets[f], fields[f].dtype, std::move(shape));
  }
}

void EpochRun::build_listed(BatchState& state, Batch& result) {
  const size_t field_count = plan_.source->fields().size();
  result.listed.assign(field_count, {});
  for (int64_t row = 0; row < state.rows; ++row) {
    if (state.skipped[static_cast<size_t>(row)]) continue;
    result.indices.push_back(state.indices[static_cast<size_t>(row)]);
    for (size_t f = 0; f < field_count; ++f) {
      result.listed[f].push_back(std::move(state.row_tensors[static_cast<size_t>(row)][f]));
    }
  }
}

EpochIterator::Status EpochRun::next(Batch& out, std::chrono::milliseconds timeout) {
  while (true) {
    const EpochIterator::Status status = next_in_order(out, timeout);
    // Every batch is planned with at least one row, so one without indices
    // had all of them skipped: an empty batch would reach the model (a loss
    // averaged over no samples is NaN), so the pass moves on — on one rank
    // only. Ranks of a sharded loader deliver it empty: each must take as
    // many steps as the others, or their collectives wait forever.
    if (status != EpochIterator::Status::kBatch || !out.indices.empty() ||
        plan_.options.world_size > 1) {
      if (status == EpochIterator::Status::kBatch && !carried_warnings_.empty()) {
        out.warnings.insert(out.warnings.begin(), carried_warnings_.begin(),
                            carried_warnings_.end());
        carried_warnings_.clear();
      }
      return status;
    }
    carried_warnings_.insert(carried_warnings_.end(), out.warnings.begin(), out.warnings.end());
    out = Batch{};
  }
}

std::vector<Warning> EpochRun::take_warnings() { return std::exchange(carried_warnings_, {}); }

EpochIterator::Status EpochRun::next_in_order(Batch& out, std::chrono::milliseconds timeout) {
  if (::getpid() != owner_pid_) {
    throw Error("this iteration was started in process " + std::to_string(owner_pid_) +
                " and cannot continue in a forked child (its worker threads exist only in the "
                "parent); create the loader inside the child, or start workers with spawn");
  }
  const auto started = Clock::now();
  std::unique_lock lock(mutex_);
  if (finished_ || delivered_ >= plan_.num_batches) {
    finished_ = true;
    lock.unlock();
    // Every batch was assembled: no read of this pass is left.
    tell_source_pass_ended();
    return EpochIterator::Status::kEnd;
  }
  BatchState& state = ring_[static_cast<size_t>(delivered_ % plan_.prefetch)];
  const auto here = [&] {
    return cancelled_.load() || (state.batch == delivered_ && state.ready) ||
           run_failure_.batch <= delivered_;
  };
  // Waiting with threads held back by the window since the last wait is the
  // evidence that deepens it (pipeline/prefetch_window.h). Told once per
  // batch: a consumer polls with short timeouts (Python checks for Ctrl-C
  // every 50 ms), and each poll is the same wait.
  if (!here() && wait_counted_ != delivered_) {
    wait_counted_ = delivered_;
    if (plan_.window->consumer_waits(plan_.counters->window_wait_ns.load())) {
      window_cv_.notify_all();
    }
  }
  const bool arrived = ready_cv_.wait_for(lock, timeout, here);
  plan_.counters->consumer_wait_ns += elapsed_ns(started);
  if (!arrived) return EpochIterator::Status::kTimeout;
  if (cancelled_.load()) {
    finished_ = true;
    throw Error(
        "this iteration was cancelled: a new iteration of the same Loader started, a state "
        "was loaded into it (load_state_dict: iterate it again to resume there), or the "
        "Loader was closed");
  }
  if (run_failure_.batch <= delivered_ && !(state.batch == delivered_ && state.ready)) {
    // A worker failed outside a sample's read: the batch cannot complete.
    finished_ = true;
    const RunFailure failure = run_failure_;
    lock.unlock();
    cancel();
    int64_t index = -1;
    try {
      index = index_at(failure.position);
    } catch (...) {
    }
    throw make_sample_error(index, plan_.source->describe(),
                            index >= 0 ? plan_.source->sample_location(index) : "", failure.stage,
                            failure.cause);
  }
  state.batch = -1;
  state.slot.reset();
  --plan_.counters->batches_in_flight;
  if (state.error) {
    // The error is raised once; the pass ends with it.
    finished_ = true;
    SampleError error = std::move(*state.error);
    state.error.reset();
    lock.unlock();
    cancel();
    throw error;
  }
  out = std::move(state.result);
  out.batch_index = delivered_;
  state.result = Batch{};
  ++delivered_;
  ++plan_.counters->batches_delivered;
  lock.unlock();
  window_cv_.notify_all();
  return EpochIterator::Status::kBatch;
}

std::vector<SkippedSample> EpochRun::skipped() const {
  std::lock_guard lock(mutex_);
  return skipped_;
}

}  // namespace leanloader::detail
