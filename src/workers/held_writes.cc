#include "workers/held_writes.h"

#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>

#include <array>
#include <atomic>
#include <csignal>

#include "core/signal_chain.h"

namespace leanloader::detail {

namespace {

std::mutex g_one_hold;
struct sigaction g_previous {};

// The range held now: [g_held_start, g_held_end), empty when both are 0.
std::atomic<uintptr_t> g_held_start{0};
std::atomic<uintptr_t> g_held_end{0};

// Ranges held recently. A thread whose write faulted during a hold may run
// its handler only after the hold ended (it was preempted in between): the
// write is then let run again if it hit one of these. Each lets a bounded
// number of such faults through, so that a range made read-only since by
// someone else still reaches the earlier handler.
struct RecentHold {
  std::atomic<uintptr_t> start{0};
  std::atomic<uintptr_t> end{0};
  std::atomic<int> late_faults_left{0};
};
constexpr size_t kRecentHolds = 16;
constexpr int kLateFaultsPerHold = 4096;
std::array<RecentHold, kRecentHolds> g_recent;
std::atomic<size_t> g_next_recent{0};

bool in_held_range(uintptr_t address) {
  return address >= g_held_start.load(std::memory_order_acquire) &&
         address < g_held_end.load(std::memory_order_acquire);
}

void on_sigsegv(int signal_number, siginfo_t* info, void* context) {
  if (info->si_code == SEGV_ACCERR) {
    const auto address = reinterpret_cast<uintptr_t>(info->si_addr);
    if (in_held_range(address)) {
      while (in_held_range(address)) sched_yield();
      return;  // the write runs again, on the range's new pages
    }
    for (RecentHold& recent : g_recent) {
      if (address >= recent.start.load(std::memory_order_acquire) &&
          address < recent.end.load(std::memory_order_acquire) &&
          recent.late_faults_left.fetch_sub(1, std::memory_order_relaxed) > 0) {
        return;
      }
    }
  }
  forward_to_previous(g_previous, signal_number, info, context);  // not ours
}

// A child forked by another thread during a hold has the held range
// read-only and nothing that would ever end the hold there: its own pages
// (not replaced in the child) get their write access back.
void end_hold_in_child() {
  const uintptr_t start = g_held_start.load(std::memory_order_acquire);
  const uintptr_t end = g_held_end.load(std::memory_order_acquire);
  if (start != 0 && end > start) {
    ::mprotect(reinterpret_cast<void*>(start), end - start, PROT_READ | PROT_WRITE);
  }
  g_held_end.store(0, std::memory_order_release);
  g_held_start.store(0, std::memory_order_release);
}

void install_handler() {
  install_chained_handler(SIGSEGV, &on_sigsegv, &g_previous);
  ::pthread_atfork(nullptr, nullptr, &end_hold_in_child);
}

}  // namespace

HeldWrites::HeldWrites(uintptr_t start, size_t bytes)
    : one_at_a_time_(g_one_hold), start_(start), bytes_(bytes) {
  static std::once_flag installed;
  std::call_once(installed, install_handler);
  if (bytes == 0) return;
  // Published before the protection: a fault can only follow it.
  g_held_start.store(start, std::memory_order_release);
  g_held_end.store(start + bytes, std::memory_order_release);
  held_ = ::mprotect(reinterpret_cast<void*>(start), bytes, PROT_READ) == 0;
  if (!held_) {
    g_held_end.store(0, std::memory_order_release);
    g_held_start.store(0, std::memory_order_release);
  }
}

void HeldWrites::restore_write_access() {
  if (held_) ::mprotect(reinterpret_cast<void*>(start_), bytes_, PROT_READ | PROT_WRITE);
}

HeldWrites::~HeldWrites() {
  if (!held_) return;
  // Recorded as recent before the hold ends, so that a late handler finds it.
  RecentHold& recent = g_recent[g_next_recent.fetch_add(1) % kRecentHolds];
  recent.end.store(0, std::memory_order_release);
  recent.start.store(start_, std::memory_order_release);
  recent.late_faults_left.store(kLateFaultsPerHold, std::memory_order_relaxed);
  recent.end.store(start_ + bytes_, std::memory_order_release);
  g_held_end.store(0, std::memory_order_release);
  g_held_start.store(0, std::memory_order_release);
}

}  // namespace leanloader::detail
