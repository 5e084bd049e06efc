#include "leanloader/workers/worker_process.h"

#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>

#include "leanloader/core/error.h"

namespace leanloader {

bool set_parent_death_signal(int signal, int expected_parent) {
  if (::prctl(PR_SET_PDEATHSIG, signal, 0, 0, 0) != 0) {
    throw IoError("prctl(PR_SET_PDEATHSIG) failed for", "this process", errno);
  }
  return expected_parent <= 0 || ::getppid() == expected_parent;
}

void set_process_name(const std::string& name) {
  if (::prctl(PR_SET_NAME, name.c_str(), 0, 0, 0) != 0) {
    throw IoError("prctl(PR_SET_NAME) failed for", "this process", errno);
  }
}

}  // namespace leanloader
