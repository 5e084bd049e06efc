// Whether the calling thread has waited for storage in a page fault. Internal.
//
// Rows copied out of a file's mapping come from storage through page faults
// (the kernel's read-around of each fault), which no read call reports: the
// thread's count of major faults (faults that waited for I/O) tells that the
// mapped data is not in the page cache, so that the loader can announce the
// next rows and the storage around them as it does for rows read with pread.
#pragma once

#include <atomic>
#include <cstdint>

namespace leanloader::detail {

class StorageFaultWatch {
 public:
  // The first `eager_checks` calls on the watch (of any thread) each check:
  // a pass's first rows tell whether its data is cold, and each chunk read
  // before that is known waits for its own faults (cold 64 KiB rows, first
  // batch of 256: 0.62-0.64 s checking every 16th chunk, 0.28-0.33 s every
  // chunk). Then at most every `check_every`-th call on each thread: a
  // check is a getrusage(RUSAGE_THREAD) call (~0.5 us), as much as copying
  // 2-3 KiB.
  explicit StorageFaultWatch(int eager_checks = 64, uint32_t check_every = 16) noexcept
      : eager_checks_(eager_checks), check_every_(check_every) {}

  // True when this call checked and the calling thread has had major page
  // faults since its previous check (on any watch: the count is the
  // thread's). A thread's first call checks and only records the count.
  bool faulted_since_last_check() const noexcept;

 private:
  mutable std::atomic<int> eager_checks_;
  uint32_t check_every_;
};

}  // namespace leanloader::detail
