// EpochIterator: the consumer's side of one pass over an epoch.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "leanloader/pipeline/batch.h"

namespace leanloader {

namespace detail {
class EpochRun;
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
  // and after the last batch, returns kEnd. A batch whose every sample was
  // skipped (on_error=skip) is passed over, its warnings carried to the next
  // (delivered empty when sharded over ranks: each rank takes every step).
  Status next(Batch& out, std::chrono::milliseconds timeout);
  // After kEnd: warnings of passed-over batches that no batch carried.
  std::vector<Warning> take_warnings();
  // The batch next() returned last never reached the consumer (raising its
  // warnings raised): it is not counted as delivered, so a state taken now
  // resumes at it. The pass cannot hand it out again; cancel() it.
  void undo_last_delivery();
  uint64_t epoch() const;
  // Samples dropped so far with on_error=skip (the first 100 in detail).
  std::vector<SkippedSample> skipped() const;
  uint64_t skipped_count() const;
  void cancel();

 private:
  std::shared_ptr<detail::EpochRun> run_;
};

}  // namespace leanloader
