#include "io/guarded_copy.h"

#include <atomic>
#include <csetjmp>
#include <csignal>
#include <mutex>

#include "core/signal_chain.h"

namespace leanloader::detail {

namespace {

// The jump target of the copy this thread is in, or null. Set before the
// copy (so the thread-local block exists before the handler reads it).
// (initial-exec would spare a call into the dynamic linker per copy, ~55
// instructions, but the extension module cannot then be loaded: no static
// TLS left once torch and NumPy are.)
thread_local sigjmp_buf* t_guarded_copy = nullptr;

struct sigaction g_previous {};

void on_sigbus(int signal_number, siginfo_t* info, void* context) {
  if (sigjmp_buf* jump = t_guarded_copy) {
    t_guarded_copy = nullptr;
    siglongjmp(*jump, 1);  // SA_NODEFER: SIGBUS was not blocked, nothing to unblock
  }
  forward_to_previous(g_previous, signal_number, info, context);  // not ours
}

void install_handler_once() {
  static std::once_flag installed;
  std::call_once(installed, [] { install_chained_handler(SIGBUS, &on_sigbus, &g_previous); });
}

// Back from the handler without restoring the signal mask (saving it would
// cost a system call per copy). SA_NODEFER leaves SIGBUS unblocked where the
// kernel runs our handler, but a runtime that wraps handlers (ThreadSanitizer's)
// may have blocked it: unblock it, or this thread's next SIGBUS would kill the
// process.
void unblock_sigbus() noexcept {
  sigset_t bus;
  sigemptyset(&bus);
  sigaddset(&bus, SIGBUS);
  pthread_sigmask(SIG_UNBLOCK, &bus, nullptr);
}

}  // namespace

bool guarded_call(void (*body)(void*), void* context) noexcept {
  install_handler_once();
  sigjmp_buf*& guarded = t_guarded_copy;
  sigjmp_buf jump;
  if (sigsetjmp(jump, 0) != 0) {
    unblock_sigbus();
    return false;
  }
  guarded = &jump;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  body(context);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  guarded = nullptr;
  return true;
}

bool guarded_copy(void* dst, const void* src, size_t bytes, Stores stores) noexcept {
  install_handler_once();
  sigjmp_buf*& guarded = t_guarded_copy;  // one lookup of the thread-local
  sigjmp_buf jump;
  if (sigsetjmp(jump, 0) != 0) {
    unblock_sigbus();
    return false;
  }
  guarded = &jump;
  // The compiler must not move the copy out from between the two stores.
  std::atomic_signal_fence(std::memory_order_seq_cst);
  copy_with(stores, dst, src, bytes);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  guarded = nullptr;
  return true;
}

}  // namespace leanloader::detail
