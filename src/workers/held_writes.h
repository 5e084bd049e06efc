// Other threads' writes held while a range's pages are replaced. Internal.
//
// make_shared_copy (shared_copy.h) copies a block and then maps the block's
// pages from the copy. A thread of this process that writes the block in
// between (NumPy and torch loops run without the GIL) would write the old
// page after it was copied: the write would be lost when the page is
// replaced. HeldWrites makes the range read-only first; such a write faults,
// and a SIGSEGV handler of ours (in front of any earlier one:
// core/signal_chain.h) holds that thread until the hold ends, then lets the
// write run again, on the new pages. Writes are delayed by one chunk's copy
// at most, never lost. Faults outside a held range, or not caused by the
// protection, go to the earlier handler as if ours were not there. A child
// forked by another thread during a hold gets write access to the range
// back at once (pthread_atfork): nothing would end the hold there.
//
// Limits: a write by the kernel on a thread's behalf (read(2) into the
// array) fails with EFAULT instead of waiting; Python's faulthandler enabled
// after the first hold runs before ours and prints a traceback for a held
// write (which then completes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>

namespace leanloader::detail {

class HeldWrites {
 public:
  // Holds writes to the page-aligned range [start, start + bytes). One hold
  // at a time in the process (a second waits for the first to end).
  HeldWrites(uintptr_t start, size_t bytes);
  ~HeldWrites();
  HeldWrites(const HeldWrites&) = delete;
  HeldWrites& operator=(const HeldWrites&) = delete;

  // False when the range could not be made read-only: nothing is held, and
  // the caller must leave the range's pages alone.
  bool held() const { return held_; }

  // The range keeps its own pages after all (their replacement failed):
  // writable again before the writers held go on.
  void restore_write_access();

 private:
  std::unique_lock<std::mutex> one_at_a_time_;
  uintptr_t start_ = 0;
  size_t bytes_ = 0;
  bool held_ = false;
};

}  // namespace leanloader::detail
