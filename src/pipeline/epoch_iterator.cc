#include "leanloader/pipeline/epoch_iterator.h"

#include "pipeline/epoch_run.h"

namespace leanloader {

EpochIterator::~EpochIterator() { cancel(); }

EpochIterator::Status EpochIterator::next(Batch& out, std::chrono::milliseconds timeout) {
  return run_->next(out, timeout);
}

std::vector<Warning> EpochIterator::take_warnings() { return run_->take_warnings(); }

void EpochIterator::undo_last_delivery() { run_->undo_last_delivery(); }

uint64_t EpochIterator::epoch() const { return run_->epoch(); }

std::vector<SkippedSample> EpochIterator::skipped() const { return run_->skipped(); }

uint64_t EpochIterator::skipped_count() const { return run_->skipped_count(); }

void EpochIterator::cancel() { run_->cancel(); }

}  // namespace leanloader
