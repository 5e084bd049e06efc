// PressurePolicy: how many batches a Loader may have in flight, moved by the
// memory still available. Internal.
//
// Below the threshold the window drops to one batch and idle slots are given
// back; above kRecovery x the threshold it returns to `prefetch` (hysteresis,
// so a loader near the line does not flap). Shared by every pass of a Loader.
// Thread-safety: check() may be called by any worker; only one of them reads
// memory at a time, at most every kCheckInterval.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "leanloader/pipeline/batch_pool.h"

namespace leanloader::detail {

class PressurePolicy {
 public:
  static constexpr int64_t kCheckIntervalNs = 100'000'000;  // 100 ms
  static constexpr double kRecovery = 1.25;

  // `threshold` 0 turns the policy off (the window stays at `prefetch`).
  PressurePolicy(std::function<size_t()> available_memory, size_t threshold, int prefetch);

  // Reads the available memory when due and moves the window. Returns true
  // when the window widened again (threads waiting for it must be woken).
  // Throws whatever reading the available memory throws.
  bool check(BatchPool& pool);

  int window() const noexcept { return window_.load(); }
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
  std::atomic<int> window_;
  std::atomic<bool> under_pressure_{false};
  std::atomic<uint64_t> events_{0};
  std::atomic<int64_t> next_check_ns_{0};
  std::atomic<bool> warning_pending_{false};
  std::atomic<bool> warned_{false};
  std::string message_;  // written once, before warning_pending_ is set
};

}  // namespace leanloader::detail
