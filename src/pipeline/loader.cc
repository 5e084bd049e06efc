#include "leanloader/pipeline/loader.h"

#include "leanloader/core/error.h"
#include "leanloader/memory/memory_monitor.h"
#include "pipeline/epoch_run.h"

namespace leanloader {

namespace {

size_t round_up(size_t value, size_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

// collate=list slots hold variable-sized samples; size them for twice the
// typical batch so that ordinary variation fits, and round to whole pages.
constexpr size_t kListSlotHeadroom = 2;
constexpr size_t kPageBytes = 4096;
// Default pressure threshold: this fraction of the memory the process can use.
constexpr double kDefaultPressureFraction = 0.10;

}  // namespace

size_t auto_memory_budget() {
  return static_cast<size_t>(kAutoBudgetFraction * static_cast<double>(available_memory_bytes()));
}

Loader::Loader(std::shared_ptr<const Source> source, LoaderOptions options)
    : source_(std::move(source)),
      options_(options),
      sampler_(source_ ? static_cast<uint64_t>(source_->size()) : 0, options.shuffle, options.seed),
      counters_(std::make_shared<detail::LoaderCounters>()) {
  if (source_ == nullptr) throw InvalidArgument("Loader needs a source");
  if (options_.batch_size < 1) {
    throw InvalidArgument("batch_size must be at least 1, got " +
                          std::to_string(options_.batch_size));
  }
  if (options_.prefetch < 1) {
    throw InvalidArgument("prefetch must be at least 1, got " + std::to_string(options_.prefetch));
  }
  if (!(options_.max_skip_fraction >= 0.0 && options_.max_skip_fraction <= 1.0)) {
    throw InvalidArgument("max_skip_fraction must lie in [0, 1], got " +
                          std::to_string(options_.max_skip_fraction));
  }
  const auto& fields = source_->fields();
  const auto batch = static_cast<size_t>(options_.batch_size);
  if (options_.collate == Collate::kStack) {
    for (const FieldSpec& field : fields) {
      if (!field.shape.has_value()) {
        throw InvalidArgument(source_->describe() + ": field '" + field.name +
                              "' has a different shape per sample and cannot be stacked; pass "
                              "collate='list'");
      }
      const size_t row = shape_numel(*field.shape) * dtype_size(field.dtype);
      field_offsets_.push_back(slot_bytes_);
      row_bytes_.push_back(row);
      slot_bytes_ += round_up(row * batch, kBufferAlignment);
    }
  } else {
    slot_bytes_ = kListSlotHeadroom * batch *
                  (source_->estimated_sample_bytes() + fields.size() * kBufferAlignment);
  }
  slot_bytes_ = round_up(std::max<size_t>(slot_bytes_, 1), kPageBytes);

  // Slots: `prefetch` batches being prepared, the batch just delivered, and
  // the previous one, which a `for` loop still holds until the new one is
  // bound to its variable.
  num_slots_ = static_cast<size_t>(options_.prefetch) + 2;
  if (options_.memory_budget.has_value()) {
    const size_t affordable = *options_.memory_budget / slot_bytes_;
    if (affordable < 2) {
      throw InvalidArgument("memory_budget of " + std::to_string(*options_.memory_budget) +
                            " bytes is below two batch slots of " + std::to_string(slot_bytes_) +
                            " bytes each (batch_size " + std::to_string(options_.batch_size) +
                            "); raise memory_budget or lower batch_size");
    }
    num_slots_ = std::min(num_slots_, affordable);
  }
  prefetch_ = static_cast<int>(std::min<size_t>(static_cast<size_t>(options_.prefetch),
                                                std::max<size_t>(1, num_slots_ - 2)));
  pool_ = BatchPool::create(slot_bytes_, num_slots_);

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
  pressure_ = std::make_shared<detail::PressurePolicy>(std::move(available), threshold, prefetch_);
  executor_ = std::make_unique<Executor>(options_.num_threads);
}

Loader::~Loader() { close(); }

int64_t Loader::num_batches() const noexcept {
  const int64_t size = source_->size();
  return options_.drop_last ? size / options_.batch_size
                            : (size + options_.batch_size - 1) / options_.batch_size;
}

std::unique_ptr<EpochIterator> Loader::iterate() {
  if (closed_) throw Error("the Loader is closed");
  detail::RunPlan plan{source_, pool_,         counters_, pressure_, options_,       sampler_,
                       epoch_,  num_batches(), 0,         prefetch_, field_offsets_, row_bytes_};
  plan.num_positions = std::min(source_->size(), plan.num_batches * options_.batch_size);
  auto run = std::make_shared<detail::EpochRun>(std::move(plan));
  current_run_ = run;
  executor_->run(run);
  ++epoch_;
  return std::make_unique<EpochIterator>(std::move(run));
}

LoaderStats Loader::stats() const {
  LoaderStats stats;
  stats.read_ns = counters_->read_ns;
  stats.transform_ns = counters_->transform_ns;
  stats.collate_ns = counters_->collate_ns;
  stats.consumer_wait_ns = counters_->consumer_wait_ns;
  stats.samples_read = counters_->samples_read;
  stats.samples_skipped = counters_->samples_skipped;
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
  stats.window = pressure_->window();
  stats.under_pressure = pressure_->under_pressure();
  stats.pressure_events = pressure_->events();
  stats.pressure_threshold = pressure_->threshold();
  return stats;
}

bool Loader::close() {
  if (closed_) return true;
  closed_ = true;
  if (auto run = current_run_.lock()) run->cancel();
  return executor_->shutdown();
}

}  // namespace leanloader
