// PrefetchWindow: how many batches a Loader may have in flight. Internal.
//
// Depth. The window starts one batch ahead of the consumer: with the batch
// the consumer holds, two slots (double buffering). It deepens by one, up to
// `prefetch`, only on evidence that a deeper window would have had a batch
// ready: the consumer had to wait for a batch while, since it last waited,
// the worker threads spent at least kGrowthIdleFraction of their time held
// back by the window. A producer-bound pipeline (threads always busy, the
// consumer always waiting) and a consumer-bound one (the consumer never
// waits) stay one batch ahead: a deeper window would cost a slot of memory
// and gain nothing. What deepens it: a consumer whose steps vary around the
// producers' pace, or batches of few samples per thread (threads idle while
// the last samples of a batch finish). The depth never shrinks.
//
// Memory pressure. Below the threshold the window drops to one batch and idle
// slots are given back; above kRecovery x the threshold it returns to the
// depth (hysteresis, so a loader near the line does not flap).
//
// Shared by every pass of a Loader. Thread-safety: check() may be called by
// any worker (only one reads memory at a time, at most every kCheckInterval);
// consumer_waits() by the consumer.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "leanloader/pipeline/batch_pool.h"

namespace leanloader::detail {

class PrefetchWindow {
 public:
  static constexpr int64_t kCheckIntervalNs = 100'000'000;  // 100 ms
  static constexpr double kRecovery = 1.25;
  static constexpr double kGrowthIdleFraction = 0.05;

  // `threshold` 0 turns the pressure checks off. `adaptive` false: the depth
  // is `prefetch` from the start. `num_threads`: the worker threads whose
  // held-back time is compared with the time that passed.
  PrefetchWindow(std::function<size_t()> available_memory, size_t threshold, int prefetch,
                 int num_threads, bool adaptive);

  // Reads the available memory when due and moves the window. Returns true
  // when the window widened again (threads waiting for it must be woken).
  // Throws whatever reading the available memory throws.
  bool check(BatchPool& pool);

  // The consumer found its next batch not ready. `held_back_total_ns`: the
  // time worker threads have waited for the window so far, summed (the
  // loader's window_wait_ns); what was added since the previous wait is the
  // evidence. Returns true when the depth grew (threads waiting for the window
  // must be woken).
  bool consumer_waits(uint64_t held_back_total_ns) noexcept;

  int window() const noexcept { return under_pressure_.load() ? 1 : depth_.load(); }
  int prefetch() const noexcept { return prefetch_; }
  bool under_pressure() const noexcept { return under_pressure_.load(); }
  uint64_t events() const noexcept { return events_.load(); }
  size_t threshold() const noexcept { return threshold_; }

  // The warning of the first pressure event, handed out once.
  std::optional<std::string> take_warning();

 private:
  std::function<size_t()> available_memory_;
  size_t threshold_;
  int prefetch_;
  int num_threads_;
  std::atomic<int> depth_;
  // The consumer's, at its previous wait (or construction).
  std::atomic<int64_t> last_wait_ns_;
  std::atomic<uint64_t> last_held_back_total_ns_{0};
  std::atomic<bool> under_pressure_{false};
  std::atomic<uint64_t> events_{0};
  std::atomic<int64_t> next_check_ns_{0};
  std::atomic<bool> warning_pending_{false};
  std::atomic<bool> warned_{false};
  std::string message_;  // written once, before warning_pending_ is set
};

}  // namespace leanloader::detail
