// Worker-process guards for processes that share memory with a parent
// (ProcessWorkers, python/leanloader/workers.py).
#pragma once

namespace leanloader {

// Asks the kernel to send `signal` to this process when its parent dies
// (prctl PR_SET_PDEATHSIG), so that a worker never outlives a main process
// killed with SIGKILL and never keeps its shared memory alive. Then checks
// that `expected_parent` (when > 0) is still the parent: it may have died
// before the call. Returns false when it already died. Throws IoError when
// prctl fails.
bool set_parent_death_signal(int signal, int expected_parent);

}  // namespace leanloader
