// LoaderStats: what a Loader has done so far and what it holds now.
#pragma once

#include <cstddef>
#include <cstdint>

namespace leanloader {

// Cumulative counters since construction (times in nanoseconds) plus the
// current occupancy of the pool.
struct LoaderStats {
  uint64_t read_ns = 0;  // reading a sample into its row: I/O, decoding, transforms
  uint64_t collate_ns = 0;
  uint64_t consumer_wait_ns = 0;
  uint64_t window_wait_ns = 0;  // worker threads held back by the prefetch window, summed
  uint64_t samples_read = 0;
  // Chunks of rows the worker threads claimed (each claim takes the run's lock
  // and touches shared counters; small rows are claimed up to 64 at a time).
  uint64_t work_claims = 0;
  uint64_t samples_skipped = 0;
  uint64_t samples_warned = 0;  // distinct samples read with a warning (SampleWriter::warn)
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
  int window = 0;  // batches allowed in flight now (the prefetch depth, or 1 under pressure)
  bool under_pressure = false;
  uint64_t pressure_events = 0;  // times available memory fell below the threshold
  size_t pressure_threshold = 0;
};

}  // namespace leanloader
