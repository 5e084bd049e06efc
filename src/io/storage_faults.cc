#include "io/storage_faults.h"

#include <sys/resource.h>

namespace leanloader::detail {

namespace {

// Per thread: calls since the last check, and the major faults counted then
// (-1: not yet checked).
thread_local uint32_t calls_since_check = 0;
thread_local long major_faults_at_check = -1;

}  // namespace

bool StorageFaultWatch::faulted_since_last_check() const noexcept {
  // The watch's eager checks first (a pass's first chunks); past them a
  // thread checks on its first call, to learn its count, then on every
  // check_every-th.
  const bool eager = eager_checks_.load(std::memory_order_relaxed) > 0 &&
                     eager_checks_.fetch_sub(1, std::memory_order_relaxed) > 0;
  if (!eager && major_faults_at_check >= 0 && ++calls_since_check < check_every_) return false;
  calls_since_check = 0;
  struct rusage usage {};
  if (::getrusage(RUSAGE_THREAD, &usage) != 0) return false;
  const long before = major_faults_at_check;
  major_faults_at_check = usage.ru_majflt;
  return before >= 0 && usage.ru_majflt > before;
}

}  // namespace leanloader::detail
