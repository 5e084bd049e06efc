#include "pipeline/prefetch_window.h"

#include <algorithm>
#include <chrono>

namespace leanloader::detail {

namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

PrefetchWindow::PrefetchWindow(std::function<size_t()> available_memory, size_t threshold,
                               int prefetch, int num_threads, bool adaptive)
    : available_memory_(std::move(available_memory)),
      threshold_(threshold),
      prefetch_(prefetch),
      num_threads_(std::max(1, num_threads)),
      depth_(adaptive ? 1 : prefetch),
      last_wait_ns_(now_ns()) {}

bool PrefetchWindow::consumer_waits(uint64_t held_back_total_ns) noexcept {
  const int64_t now = now_ns();
  const uint64_t held_back =
      held_back_total_ns - last_held_back_total_ns_.exchange(held_back_total_ns);
  const int64_t elapsed = now - last_wait_ns_.exchange(now);
  const int depth = depth_.load();
  if (depth >= prefetch_ || elapsed <= 0) return false;
  const double idle = static_cast<double>(held_back) /
                      (static_cast<double>(elapsed) * static_cast<double>(num_threads_));
  if (idle < kGrowthIdleFraction) return false;
  depth_.store(depth + 1);
  return !under_pressure_.load();
}

bool PrefetchWindow::check(BatchPool& pool) {
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
    const size_t freed = pool.trim();
    if (!warned_.exchange(true)) {
      message_ = "memory pressure: " + std::to_string(available >> 20) +
                 " MiB available, below the " + std::to_string(threshold_ >> 20) +
                 " MiB threshold; the loader keeps one batch in flight (instead of up to " +
                 std::to_string(prefetch_) + ") and gave back " + std::to_string(freed >> 20) +
                 " MiB of idle batch slots until memory recovers";
      warning_pending_ = true;
    }
    return false;
  }
  if (under_pressure_ &&
      static_cast<double>(available) > kRecovery * static_cast<double>(threshold_)) {
    under_pressure_ = false;
    return true;
  }
  return false;
}

std::optional<std::string> PrefetchWindow::take_warning() {
  if (!warning_pending_.exchange(false)) return std::nullopt;
  return message_;
}

}  // namespace leanloader::detail
