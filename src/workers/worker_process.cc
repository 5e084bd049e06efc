#include "leanloader/workers/worker_process.h"

#include <poll.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <thread>

#include "leanloader/core/error.h"

namespace leanloader {

bool set_parent_death_signal(int signal, int expected_parent) {
  if (::prctl(PR_SET_PDEATHSIG, signal, 0, 0, 0) != 0) {
    throw IoError("prctl(PR_SET_PDEATHSIG) failed for", "this process", errno);
  }
  return expected_parent <= 0 || ::getppid() == expected_parent;
}

bool exit_with_process(int pid) {
  if (pid <= 0) return true;
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
#ifdef SYS_pidfd_open
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
#else
  const int pidfd = -1;
#endif
  if (pidfd < 0 && errno == ESRCH) return false;
  std::thread([pid, pidfd] {
    if (pidfd >= 0) {
      pollfd watched{pidfd, POLLIN, 0};
      while (::poll(&watched, 1, -1) < 0 && errno == EINTR) {
      }
    } else {
      while (::kill(pid, 0) == 0 || errno != ESRCH) ::usleep(200'000);
    }
    ::kill(::getpid(), SIGKILL);
  }).detach();
  return true;
}

void set_process_name(const std::string& name) {
  if (::prctl(PR_SET_NAME, name.c_str(), 0, 0, 0) != 0) {
    throw IoError("prctl(PR_SET_NAME) failed for", "this process", errno);
  }
}

}  // namespace leanloader
