#include "io/guarded_copy.h"

#include <atomic>
#include <csetjmp>
#include <csignal>
#include <cstring>
#include <mutex>

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
  // Not ours: what would have happened without this handler.
  if (g_previous.sa_flags & SA_SIGINFO) {
    g_previous.sa_sigaction(signal_number, info, context);
    return;
  }
  if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN) {
    g_previous.sa_handler(signal_number);
    return;
  }
  // The default action: restore it; the faulting access runs again and the
  // kernel delivers SIGBUS with its default disposition (a core dump).
  struct sigaction default_action {};
  default_action.sa_handler = SIG_DFL;
  sigemptyset(&default_action.sa_mask);
  sigaction(SIGBUS, &default_action, nullptr);
}

void install_handler() {
  struct sigaction action {};
  action.sa_sigaction = &on_sigbus;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
  sigaction(SIGBUS, &action, &g_previous);
}

}  // namespace

bool guarded_copy(void* dst, const void* src, size_t bytes) noexcept {
  static std::once_flag installed;
  std::call_once(installed, install_handler);
  sigjmp_buf*& guarded = t_guarded_copy;  // one lookup of the thread-local
  sigjmp_buf jump;
  if (sigsetjmp(jump, 0) != 0) return false;
  guarded = &jump;
  // The compiler must not move the copy out from between the two stores.
  std::atomic_signal_fence(std::memory_order_seq_cst);
  std::memcpy(dst, src, bytes);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  guarded = nullptr;
  return true;
}

}  // namespace leanloader::detail
