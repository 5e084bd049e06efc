// Worker-process guards for processes that share memory with a parent
// (ProcessWorkers, python/leanloader/workers.py).
#pragma once

#include <string>

namespace leanloader {

// Asks the kernel to send `signal` to this process when its parent dies
// (prctl PR_SET_PDEATHSIG), so that a worker never outlives a main process
// killed with SIGKILL and never keeps its shared memory alive. Then checks
// that `expected_parent` (when > 0) is still the parent: it may have died
// before the call. Returns false when it already died. Throws IoError when
// prctl fails.
bool set_parent_death_signal(int signal, int expected_parent);

// Kills this process (SIGKILL) when process `pid` exits, from a native thread
// that waits on a pidfd (polling kill(pid, 0) every 200 ms where pidfd_open
// is missing): a worker whose parent is not the main process (a fork
// server's child) dies with the main process too, within a second, however
// busy its Python thread is. Returns false when `pid` is already gone.
bool exit_with_process(int pid);

// Names the calling thread (for the main thread: the process) as `ps`, `top`
// and /proc/PID/comm show it, with prctl(PR_SET_NAME); the kernel keeps the
// first 15 bytes. torch names its workers "pt_data_worker"; ours are
// "ll_data_worker". Throws IoError when prctl fails.
void set_process_name(const std::string& name);

}  // namespace leanloader
