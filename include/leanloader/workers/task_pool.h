// TaskPool: tasks queued to native-owned worker threads (an Executor), with
// results claimed by id. The engine side of `worker_mode="thread"`: the
// bindings submit closures that call Python; the pool knows nothing of
// Python.
//
// Contract: a task runs exactly once, on one worker thread, and is told that
// thread's index (0..num_threads-1, stable for the pool's life) so callers can
// keep per-thread state (a worker's seed, its worker_init_fn having run).
// A task should not throw: it stores its own outcome (one that does anyway
// has its exception rethrown by wait(), never std::terminate). wait() reports when a
// task has finished; the caller reads the outcome from wherever the task
// stored it. Tasks never started by close() are handed back to the caller,
// which destroys them under its own rules (the bindings hold the GIL).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>

#include "leanloader/pipeline/executor.h"

namespace leanloader {

class TaskPool {
 public:
  using Task = std::function<void(int worker)>;

  explicit TaskPool(int num_threads);
  ~TaskPool();
  TaskPool(const TaskPool&) = delete;
  TaskPool& operator=(const TaskPool&) = delete;

  int num_threads() const noexcept { return executor_.num_threads(); }

  // Queues `task` for any thread: the first that is free and has no pinned
  // task waiting takes it (shared tasks wait while every thread has pinned
  // work). Returns its id. Throws Error once the pool is closed.
  int64_t submit(Task task);

  // Queues `task` for thread `worker` alone, which runs its pinned tasks in
  // the order they were queued and before any shared one (a DataLoader
  // worker's worker_init_fn comes before its batches, and runs whether or
  // not that worker gets a batch). Throws InvalidArgument for a thread the
  // pool does not have, Error once the pool is closed.
  int64_t submit_to(int worker, Task task);

  // Waits up to `timeout` for task `id` to finish. True when it has; its
  // completion is then forgotten (wait once per id). A task that threw,
  // against the contract, has its exception rethrown here.
  bool wait(int64_t id, std::chrono::milliseconds timeout);

  // Waits up to `timeout` for any task of `ids` to finish; returns the
  // first of `ids` (in their order) that has, or -1. Its completion is kept:
  // claim it with wait(). (in_order=False: the first batch ready.)
  int64_t wait_any(std::span<const int64_t> ids, std::chrono::milliseconds timeout);

  // Stops the threads (a task already running finishes first, up to
  // `deadline`) and returns the tasks that never started. Idempotent. In a
  // child forked from the process that created the pool it touches nothing
  // the parent's threads may have held (their mutex, their queues: those
  // are leaked, never destroyed) and returns no tasks; submit() and wait()
  // there throw Error instead of waiting on threads that do not exist.
  std::deque<Task> close(std::chrono::milliseconds deadline = std::chrono::milliseconds(2000));

 private:
  struct Queue;
  class Worker;

  // Throws Error saying the pool cannot `what` when in a forked child.
  void refuse_in_forked_child(const char* what) const;

  // Queues `task` for any thread (worker < 0) or for thread `worker`.
  int64_t enqueue(int worker, Task task);

  std::shared_ptr<Queue> queue_;
  Executor executor_;
  int64_t next_id_ = 0;
};

}  // namespace leanloader
