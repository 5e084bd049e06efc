#include "core/signal_chain.h"

namespace leanloader::detail {

void install_chained_handler(int signal_number, FaultHandler handler, struct sigaction* previous) {
  struct sigaction action {};
  action.sa_sigaction = handler;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
  sigaction(signal_number, &action, previous);
}

void forward_to_previous(const struct sigaction& previous, int signal_number, siginfo_t* info,
                         void* context) {
  if (previous.sa_flags & SA_SIGINFO) {
    previous.sa_sigaction(signal_number, info, context);
    return;
  }
  if (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN) {
    previous.sa_handler(signal_number);
    return;
  }
  // The default action: restore it; the faulting access runs again and the
  // kernel delivers the signal with its default disposition (a core dump).
  struct sigaction default_action {};
  default_action.sa_handler = SIG_DFL;
  sigemptyset(&default_action.sa_mask);
  sigaction(signal_number, &default_action, nullptr);
}

}  // namespace leanloader::detail
