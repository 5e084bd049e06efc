#include "pipeline/pressure_policy.h"

#include <chrono>

namespace leanloader::detail {

namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

PressurePolicy::PressurePolicy(std::function<size_t()> available_memory, size_t threshold,
                               int prefetch)
    : available_memory_(std::move(available_memory)),
      threshold_(threshold),
      prefetch_(prefetch),
      window_(prefetch) {}

bool PressurePolicy::check(BatchPool& pool) {
  if (!available_memory_ || threshold_ == 0) return false;
  const int64_t now = now_ns();
  int64_t due = next_check_ns_.load();
  if (now < due || !next_check_ns_.compare_exchange_strong(due, now + kCheckIntervalNs)) {
    return false;  // not due, or another thread is checking
  }
  const size_t available = available_memory_();
  if (!under_pressure_ && available < threshold_) {
    under_pressure_ = true;
    ++events_;
    window_ = 1;
    const size_t freed = pool.trim();
    if (!warned_.exchange(true)) {
      message_ = "memory pressure: " + std::to_string(available >> 20) +
                 " MiB available, below the " + std::to_string(threshold_ >> 20) +
                 " MiB threshold; the loader keeps one batch in flight (instead of " +
                 std::to_string(prefetch_) + ") and gave back " + std::to_string(freed >> 20) +
                 " MiB of idle batch slots until memory recovers";
      warning_pending_ = true;
    }
    return false;
  }
  if (under_pressure_ &&
      static_cast<double>(available) > kRecovery * static_cast<double>(threshold_)) {
    under_pressure_ = false;
    window_ = prefetch_;
    return true;
  }
  return false;
}

std::optional<std::string> PressurePolicy::take_warning() {
  if (!warning_pending_.exchange(false)) return std::nullopt;
  return message_;
}

}  // namespace leanloader::detail
