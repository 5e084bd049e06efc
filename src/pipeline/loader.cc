#include "leanloader/pipeline/loader.h"

#include <cstdint>
#include <cstdio>
#include <span>

#include "leanloader/core/checked_size.h"
#include "leanloader/core/dtype.h"
#include "leanloader/core/error.h"
#include "leanloader/io/content_hash.h"
#include "leanloader/memory/memory_monitor.h"
#include "pipeline/epoch_run.h"

namespace leanloader {

namespace {

[[noreturn]] void throw_slot_overflow(const std::string& source, int64_t batch_size) {
  throw InvalidArgument(source + ": a batch of " + std::to_string(batch_size) +
                        " samples does not fit in the address space; lower batch_size");
}

// collate=list slots hold variable-sized samples; size them for twice the
// typical batch so that ordinary variation fits, and round to whole pages.
constexpr size_t kListSlotHeadroom = 2;
constexpr size_t kPageBytes = 4096;
// Default pressure threshold: this fraction of the memory the process can use.
constexpr double kDefaultPressureFraction = 0.10;

}  // namespace

namespace {

// source_fingerprint() as it would read with `size` samples.
std::string fingerprint_with_size(const Source& source, int64_t size) {
  std::string text = std::to_string(size);
  for (const FieldSpec& field : source.fields()) {
    text += '|' + field.name + ':' + std::string(dtype_name(field.dtype)) + ':' +
            (field.shape ? shape_to_string(*field.shape) : std::string("varies"));
  }
  text += '|' + source.describe();
  const uint64_t hash = xxh64(std::as_bytes(std::span<const char>(text.data(), text.size())));
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(hash));
  return std::string("xxh64:") + hex;
}

}  // namespace

std::string source_fingerprint(const Source& source) {
  return fingerprint_with_size(source, source.size());
}

// What a Loader reads: the source's current snapshot, or the source itself
// when it never changes.
static std::shared_ptr<const Source> snapshot_of(const std::shared_ptr<const Source>& source) {
  if (source == nullptr) throw InvalidArgument("Loader needs a source");
  std::shared_ptr<const Source> snapshot = source->snapshot();
  return snapshot != nullptr ? snapshot : source;
}

size_t auto_memory_budget() {
  return static_cast<size_t>(kAutoBudgetFraction * static_cast<double>(available_memory_bytes()));
}

Loader::Loader(std::shared_ptr<const Source> source, LoaderOptions options)
    : source_(std::move(source)),
      snapshot_(snapshot_of(source_)),
      options_(options),
      sampler_(static_cast<uint64_t>(snapshot_->size()), options.shuffle, options.seed),
      counters_(std::make_shared<detail::LoaderCounters>()) {
  if (options_.batch_size < 1) {
    throw InvalidArgument("batch_size must be at least 1, got " +
                          std::to_string(options_.batch_size));
  }
  if (options_.world_size < 1) {
    throw InvalidArgument("world_size must be at least 1, got " +
                          std::to_string(options_.world_size));
  }
  if (options_.rank >= options_.world_size) {
    throw InvalidArgument("rank " + std::to_string(options_.rank) + " is outside world_size " +
                          std::to_string(options_.world_size) + " (ranks are 0 .. world_size - 1)");
  }
  // Validates the sharding arithmetic once (overflow of padded positions).
  (void)RankShard(static_cast<uint64_t>(snapshot_->size()),
                  static_cast<uint64_t>(options_.batch_size), options_.drop_last, options_.rank,
                  options_.world_size);
  if (options_.prefetch < 1) {
    throw InvalidArgument("prefetch must be at least 1, got " + std::to_string(options_.prefetch));
  }
  if (!(options_.max_skip_fraction >= 0.0 && options_.max_skip_fraction <= 1.0)) {
    throw InvalidArgument("max_skip_fraction must lie in [0, 1], got " +
                          std::to_string(options_.max_skip_fraction));
  }
  const auto& fields = snapshot_->fields();
  const auto batch = static_cast<size_t>(options_.batch_size);
  if (options_.collate == Collate::kStack) {
    for (const FieldSpec& field : fields) {
      if (!field.shape.has_value()) {
        throw InvalidArgument(snapshot_->describe() + ": field '" + field.name +
                              "' has a different shape per sample and cannot be stacked; pass "
                              "collate='list'");
      }
      const std::optional<size_t> row_nbytes = checked_nbytes(*field.shape, field.dtype);
      if (!row_nbytes) {
        throw InvalidArgument(snapshot_->describe() + ": field '" + field.name + "' (" +
                              std::string(dtype_name(field.dtype)) + " " +
                              shape_to_string(*field.shape) + ") has no whole byte size");
      }
      const size_t row = *row_nbytes;
      field_offsets_.push_back(slot_bytes_);
      row_bytes_.push_back(row);
      const auto field_bytes = checked_mul(row, batch);
      const auto padded =
          field_bytes ? checked_round_up(*field_bytes, kBufferAlignment) : std::nullopt;
      const auto total = padded ? checked_add(slot_bytes_, *padded) : std::nullopt;
      if (!total) throw_slot_overflow(snapshot_->describe(), options_.batch_size);
      slot_bytes_ = *total;
    }
  } else {
    const auto per_sample =
        checked_add(snapshot_->estimated_sample_bytes(), fields.size() * kBufferAlignment);
    const auto per_batch = per_sample ? checked_mul(*per_sample, batch) : std::nullopt;
    const auto total = per_batch ? checked_mul(*per_batch, kListSlotHeadroom) : std::nullopt;
    if (!total) throw_slot_overflow(snapshot_->describe(), options_.batch_size);
    slot_bytes_ = *total;
  }
  const auto page_rounded = checked_round_up(std::max<size_t>(slot_bytes_, 1), kPageBytes);
  if (!page_rounded) throw_slot_overflow(snapshot_->describe(), options_.batch_size);
  slot_bytes_ = *page_rounded;

  // Slots: `prefetch` batches being prepared, the batch just delivered, and
  // the previous one, which a `for` loop still holds until the new one is
  // bound to its variable.
  num_slots_ = static_cast<size_t>(options_.prefetch) + 2;
  // What the source holds besides the slots: its cache and, per worker
  // thread, what one read may hold (a compressed and a decoded chunk).
  const size_t cache = source_->cache_budget_bytes();
  const size_t scratch = source_->per_thread_scratch_bytes();
  const auto per_threads = options_.num_threads > 0
                               ? checked_mul(scratch, static_cast<size_t>(options_.num_threads))
                               : std::optional<size_t>(0);  // (Executor refuses the count below)
  const auto source_bytes = per_threads ? checked_add(cache, *per_threads) : std::nullopt;
  if (!source_bytes) throw_slot_overflow(snapshot_->describe(), options_.batch_size);
  source_bytes_ = *source_bytes;
  if (options_.memory_budget.has_value()) {
    const size_t budget = *options_.memory_budget;
    const size_t for_slots = budget > source_bytes_ ? budget - source_bytes_ : 0;
    const size_t affordable = for_slots / slot_bytes_;
    if (affordable < 2) {
      std::string held = " bytes is below two batch slots of " + std::to_string(slot_bytes_) +
                         " bytes each (batch_size " + std::to_string(options_.batch_size) + ")";
      if (source_bytes_ > 0) {
        held += " plus the source's " + std::to_string(cache) + " bytes of cache and " +
                std::to_string(scratch) + " bytes per thread for " +
                std::to_string(options_.num_threads) + " threads";
      }
      throw InvalidArgument("memory_budget of " + std::to_string(budget) + held +
                            "; raise memory_budget or lower batch_size" +
                            (source_bytes_ > 0 ? ", the chunk cache or num_threads" : ""));
    }
    num_slots_ = std::min(num_slots_, affordable);
  }
  const auto slots_bytes = checked_mul(num_slots_, slot_bytes_);
  if (!slots_bytes || !checked_add(*slots_bytes, source_bytes_)) {
    throw_slot_overflow(snapshot_->describe(), options_.batch_size);
  }
  prefetch_ = static_cast<int>(std::min<size_t>(static_cast<size_t>(options_.prefetch),
                                                std::max<size_t>(1, num_slots_ - 2)));
  pool_ = BatchPool::create(slot_bytes_, num_slots_, options_.slot_hooks);

  auto available = options_.available_memory;
  if (!available) available = [] { return static_cast<size_t>(available_memory_bytes()); };
  size_t threshold = 0;
  if (options_.pressure_threshold.has_value()) {
    threshold = *options_.pressure_threshold;
  } else {
    try {
      threshold = static_cast<size_t>(kDefaultPressureFraction *
                                      static_cast<double>(MemoryMonitor().total_memory_bytes()));
    } catch (const Error&) {
      threshold = 0;  // no /proc/meminfo: pressure checks are off
    }
  }
  executor_ = std::make_unique<Executor>(options_.num_threads);
  window_ = std::make_shared<detail::PrefetchWindow>(std::move(available), threshold, prefetch_,
                                                     executor_->num_threads(),
                                                     options_.adaptive_prefetch);
  fingerprint_ = source_fingerprint(*snapshot_);
}

Loader::~Loader() { close(); }

int64_t Loader::num_batches() const noexcept {
  return static_cast<int64_t>(shard_from(0).num_batches());
}

RankShard Loader::shard_from(uint64_t start) const {
  return RankShard(static_cast<uint64_t>(snapshot_->size()),
                   static_cast<uint64_t>(options_.batch_size), options_.drop_last, options_.rank,
                   options_.world_size, start);
}

std::optional<std::string> Loader::adopt_snapshot(std::shared_ptr<const Source> next) {
  if (next == snapshot_) return std::nullopt;
  const std::vector<FieldSpec>& planned = snapshot_->fields();
  const std::vector<FieldSpec>& now = next->fields();
  // An empty snapshot has no fields yet; nothing to compare.
  if (!planned.empty() && !now.empty()) {
    bool fits = planned.size() == now.size();
    for (size_t f = 0; fits && f < planned.size(); ++f) {
      fits = planned[f].name == now[f].name && planned[f].dtype == now[f].dtype &&
             (options_.collate == Collate::kList || planned[f].shape == now[f].shape);
    }
    if (!fits) {
      throw InvalidArgument(next->describe() +
                            ": its fields changed since this Loader planned its batch slots; "
                            "make a new Loader, or pass follow_updates=False to keep reading "
                            "the snapshot it was made with");
    }
  } else if (planned.empty() && !now.empty() && options_.collate == Collate::kStack) {
    throw InvalidArgument(next->describe() +
                          ": the Loader was made while the source was empty and planned no "
                          "batch slots for its fields; make a new Loader");
  }
  if (options_.world_size > 1 && next->size() != snapshot_->size()) {
    // Each rank takes its snapshot at its own pass start: ranks would
    // shard different sizes, take different numbers of steps (collectives
    // wait forever) and read samples twice or never.
    throw InvalidArgument(
        next->describe() + " changed from " + std::to_string(snapshot_->size()) + " to " +
        std::to_string(next->size()) + " samples since the last pass; sharded over " +
        std::to_string(options_.world_size) +
        " ranks, each rank would see the new size at its own pass start and ranks would take "
        "different numbers of steps. Make a new Loader on every rank at the same point (after "
        "a barrier), or pass follow_updates=False to keep reading the snapshot it was made "
        "with");
  }
  // The new size must shard (validated as in the constructor).
  (void)RankShard(static_cast<uint64_t>(next->size()), static_cast<uint64_t>(options_.batch_size),
                  options_.drop_last, options_.rank, options_.world_size);
  const int64_t before = snapshot_->size();
  snapshot_ = std::move(next);
  // The sampler is sized from this one snapshot, and so is the epoch below:
  // every position the epoch visits lies inside the permutation's domain.
  sampler_ = Sampler(static_cast<uint64_t>(snapshot_->size()), options_.shuffle, options_.seed);
  fingerprint_ = source_fingerprint(*snapshot_);
  if (snapshot_->size() == before) return std::nullopt;
  return snapshot_->describe() + " changed from " + std::to_string(before) + " to " +
         std::to_string(snapshot_->size()) + " samples; from epoch " + std::to_string(epoch_) +
         " on, this Loader reads the new contents (" + std::to_string(num_batches()) +
         " batches per epoch). Pass follow_updates=False to keep the old snapshot.";
}

std::unique_ptr<EpochIterator> Loader::iterate() {
  if (closed_) throw Error("the Loader is closed");
  uint64_t start = 0;
  const bool resuming = resume_ && resume_->epoch == epoch_;
  if (resuming) start = resume_->position;
  resume_.reset();
  // A loaded state's position means samples of the snapshot it was checked
  // against: a resumed epoch stays on it, the next one follows updates.
  std::optional<std::string> changed;
  if (options_.follow_updates && !resuming) {
    changed = adopt_snapshot(snapshot_of(source_));
  } else {
    snapshot_->check_unchanged();
  }
  const RankShard shard = shard_from(start);
  detail::RunPlan plan{snapshot_,
                       pool_,
                       counters_,
                       window_,
                       options_,
                       sampler_,
                       epoch_,
                       static_cast<int64_t>(shard.num_batches()),
                       static_cast<int64_t>(shard.num_positions()),
                       shard,
                       prefetch_,
                       field_offsets_,
                       row_bytes_,
                       {}};
  if (changed) plan.warnings.push_back(std::move(*changed));
  auto run = std::make_shared<detail::EpochRun>(std::move(plan));
  current_run_ = run;
  last_run_ = RunTrack{epoch_, shard, counters_->batches_delivered.load()};
  epoch_set_since_last_run_ = false;
  executor_->run(run);
  ++epoch_;
  return std::make_unique<EpochIterator>(std::move(run));
}

LoaderState Loader::state() const {
  LoaderState out;
  out.seed = options_.seed;
  out.shuffle = options_.shuffle;
  out.batch_size = options_.batch_size;
  out.drop_last = options_.drop_last;
  out.world_size = options_.world_size;
  out.size = static_cast<uint64_t>(snapshot_->size());
  out.fingerprint = fingerprint_;
  out.epoch = epoch_;
  if (resume_) {
    // A loaded position, unless set_epoch() moved to another epoch since.
    if (resume_->epoch == epoch_) out.position = resume_->position;
  } else if (last_run_ && !epoch_set_since_last_run_ && last_run_->epoch + 1 == epoch_) {
    // The pass started last is still this epoch's (set_epoch() was not
    // called since: a set_epoch(e + 1) after leaving epoch e early moves on
    // to e + 1, as the call says): count the batches it delivered.
    const uint64_t delivered = counters_->batches_delivered.load() - last_run_->delivered_before;
    if (delivered < last_run_->shard.num_batches()) {
      out.epoch = last_run_->epoch;
      out.position = last_run_->shard.global_position_after(delivered);
    }
  }
  return out;
}

void Loader::set_epoch(uint64_t epoch) noexcept {
  if (resume_ && resume_->epoch != epoch) resume_.reset();
  epoch_ = epoch;
  epoch_set_since_last_run_ = true;
}

void Loader::load_state(const LoaderState& state) {
  const auto size = static_cast<uint64_t>(snapshot_->size());
  if (state.version != LoaderState::kVersion) {
    throw InvalidArgument("loader state has version " + std::to_string(state.version) +
                          "; this leanloader reads version " +
                          std::to_string(LoaderState::kVersion));
  }
  // At an epoch's start a state names no sample of that epoch: a source
  // that only changed size since (a cache grown between a checkpoint and the
  // restart) is the same source, and the epoch starts on its contents now.
  const bool resized_at_epoch_start =
      state.position == 0 && state.size != size && state.size <= uint64_t{INT64_MAX} &&
      state.fingerprint == fingerprint_with_size(*snapshot_, static_cast<int64_t>(state.size));
  if ((state.fingerprint != fingerprint_ || state.size != size) && !resized_at_epoch_start) {
    throw InvalidArgument(
        "loader state was saved for another source (fingerprint " + state.fingerprint + ", " +
        std::to_string(state.size) + " samples); this loader reads " + snapshot_->describe() +
        " (fingerprint " + fingerprint_ + ", " + std::to_string(size) + " samples)");
  }
  if (state.shuffle != options_.shuffle || state.seed != options_.seed) {
    throw InvalidArgument(
        "loader state was saved with shuffle=" + std::string(state.shuffle ? "True" : "False") +
        ", seed=" + std::to_string(state.seed) + "; this loader has shuffle=" +
        (options_.shuffle ? "True" : "False") + ", seed=" + std::to_string(options_.seed) +
        ": its order would differ, so the position would not mean the same samples");
  }
  if (state.position > size) {
    throw InvalidArgument("loader state position " + std::to_string(state.position) +
                          " is past the " + std::to_string(size) + " samples of " +
                          snapshot_->describe());
  }
  // A run in progress is cancelled: the next iterate() starts at the state.
  if (auto run = current_run_.lock()) run->cancel();
  last_run_.reset();
  epoch_ = state.epoch;
  resume_ = Resume{state.epoch, state.position};
}

LoaderStats Loader::stats() const {
  LoaderStats stats;
  stats.read_ns = counters_->read_ns;
  stats.collate_ns = counters_->collate_ns;
  stats.consumer_wait_ns = counters_->consumer_wait_ns;
  stats.window_wait_ns = counters_->window_wait_ns;
  stats.samples_read = counters_->samples_read;
  stats.work_claims = counters_->work_claims;
  stats.samples_skipped = counters_->samples_skipped;
  {
    std::lock_guard lock(counters_->warned_mutex);
    stats.samples_warned = counters_->warned_samples.size();
  }
  stats.batches_delivered = counters_->batches_delivered;
  stats.heap_fallback_bytes = counters_->heap_fallback_bytes;
  stats.overflow_slots_total = pool_->overflow_total();
  stats.slots_total = num_slots_;
  stats.slots_in_use = pool_->slots_in_use();
  stats.overflow_slots_in_use = pool_->overflow_in_use();
  stats.batches_in_flight = counters_->batches_in_flight;
  stats.bytes_in_flight = stats.batches_in_flight * slot_bytes_;
  stats.slot_bytes = slot_bytes_;
  stats.planned_bytes = memory_bill();
  stats.resident_bytes = pool_->resident_bytes();
  stats.num_threads = options_.num_threads;
  stats.prefetch = prefetch_;
  stats.window = window_->window();
  stats.under_pressure = window_->under_pressure();
  stats.pressure_events = window_->events();
  stats.pressure_threshold = window_->threshold();
  return stats;
}

bool Loader::close() {
  if (closed_) return true;
  closed_ = true;
  if (auto run = current_run_.lock()) run->cancel();
  return executor_->shutdown();
}

}  // namespace leanloader
