// Executor: persistent native worker threads that run one Job at a time.
//
// Threads are created once and survive across jobs (epochs). run(job) hands
// the workers a new job after cancelling the current one and waiting (for a
// bounded time) until no worker is still inside it. Never forks.
//
// Shutdown: shutdown() cancels the job, wakes every worker and waits up to a
// deadline for them to exit; a worker still blocked in a system call that
// never returns (a read from a hung mount or a FIFO) is detached rather than
// waited for. Workers own their shared state and job by shared_ptr, so a
// detached worker never touches freed memory.
//
// Fork: a child of fork() has none of the parent's threads and may have
// inherited a lock held at the moment of the fork. In a child, run() throws
// and shutdown() only lets go of the thread handles: it neither locks nor
// joins.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <thread>
#include <vector>

namespace leanloader {

class Job {
 public:
  virtual ~Job() = default;
  // Runs on each worker thread; returns when this worker finds no more work
  // (the job is finished or cancelled). Must not throw.
  virtual void work(int worker) noexcept = 0;
  // Makes every work() call return soon. Thread-safe, idempotent.
  virtual void cancel() noexcept = 0;
};

class Executor {
 public:
  explicit Executor(int num_threads);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  int num_threads() const noexcept { return num_threads_; }
  // True in a process forked from the one that created the threads.
  bool in_forked_child() const noexcept;

  // Cancels the current job, waits up to `quiesce` for workers to leave it,
  // then starts `job` on every worker.
  void run(std::shared_ptr<Job> job,
           std::chrono::milliseconds quiesce = std::chrono::milliseconds(2000));

  // Cancels the current job and stops the threads. Returns true when all
  // threads exited within `deadline` (and were joined); false when some were
  // still blocked and were detached. Idempotent.
  bool shutdown(std::chrono::milliseconds deadline = std::chrono::milliseconds(1000));

 private:
  struct State;
  static void worker_loop(std::shared_ptr<State> state, int worker);

  int num_threads_;
  pid_t owner_pid_;
  std::shared_ptr<State> state_;
  std::vector<std::thread> threads_;
};

}  // namespace leanloader
