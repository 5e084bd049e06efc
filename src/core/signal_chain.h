// A fault handler of ours in front of whatever handler was there. Internal.
//
// leanloader handles a few faults it causes itself (SIGBUS from a file that
// shrank under a copy, io/guarded_copy.h; SIGSEGV from a write to pages
// being handed to a shared copy, workers/held_writes.h). Every other fault
// must reach the handler that was installed before ours (Python's
// faulthandler, a debugger's, a runtime's) or the default action, as if ours
// were not there.
#pragma once

#include <csignal>

namespace leanloader::detail {

using FaultHandler = void (*)(int, siginfo_t*, void*);

// Installs `handler` for `signal_number` (SA_SIGINFO | SA_NODEFER |
// SA_ONSTACK) and stores the disposition it replaces in `previous`.
void install_chained_handler(int signal_number, FaultHandler handler, struct sigaction* previous);

// What `previous` would have done with the signal: its handler is called, or
// the default action is restored so that the faulting access, run again when
// the caller's handler returns, gets it. Async-signal-safe.
void forward_to_previous(const struct sigaction& previous, int signal_number, siginfo_t* info,
                         void* context);

}  // namespace leanloader::detail
