#include "leanloader/pipeline/executor.h"

#include <unistd.h>

#include <condition_variable>
#include <mutex>

#include "leanloader/core/error.h"

namespace leanloader {

struct Executor::State {
  std::mutex mutex;
  std::condition_variable changed;  // a new job, or stop
  std::condition_variable idle;     // busy dropped, or a worker exited
  std::shared_ptr<Job> job;
  uint64_t generation = 0;
  int busy = 0;   // workers inside job->work()
  int alive = 0;  // workers not yet returned from worker_loop
  bool stop = false;
};

Executor::Executor(int num_threads)
    : num_threads_(num_threads), owner_pid_(::getpid()), state_(std::make_shared<State>()) {
  if (num_threads < 1) {
    throw InvalidArgument("num_threads must be at least 1, got " + std::to_string(num_threads));
  }
  threads_.reserve(static_cast<size_t>(num_threads));
  state_->alive = num_threads;
  for (int i = 0; i < num_threads; ++i) threads_.emplace_back(worker_loop, state_, i);
}

Executor::~Executor() { shutdown(); }

void Executor::worker_loop(std::shared_ptr<State> state, int worker) {
  uint64_t seen = 0;
  while (true) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock lock(state->mutex);
      state->changed.wait(lock, [&] { return state->stop || state->generation != seen; });
      if (state->stop) break;
      seen = state->generation;
      job = state->job;
      if (job == nullptr) continue;
      ++state->busy;
    }
    job->work(worker);
    job.reset();  // release the job outside the lock: it may free a Source
    {
      std::lock_guard lock(state->mutex);
      --state->busy;
    }
    state->idle.notify_all();
  }
  {
    std::lock_guard lock(state->mutex);
    --state->alive;
  }
  state->idle.notify_all();
}

bool Executor::in_forked_child() const noexcept { return ::getpid() != owner_pid_; }

void Executor::run(std::shared_ptr<Job> job, std::chrono::milliseconds quiesce) {
  if (in_forked_child()) {
    throw Error("this loader was created in process " + std::to_string(owner_pid_) +
                " and cannot run in a forked child (its worker threads exist only in the "
                "parent); create the loader inside the child, or start workers with spawn");
  }
  std::shared_ptr<Job> previous;
  {
    std::unique_lock lock(state_->mutex);
    if (state_->stop)
      throw Error("the loader's worker threads were shut down (close() was called)");
    previous = std::move(state_->job);
    if (previous != nullptr) {
      previous->cancel();
      // Let in-flight samples of the old job finish so that its batch slots
      // return to the pool before the new job needs them.
      state_->idle.wait_for(lock, quiesce, [&] { return state_->busy == 0; });
    }
  }
  // Drop the old job before the new one starts: the last reference to a
  // cancelled pass returns its batch slots to the pool.
  previous.reset();
  {
    std::lock_guard lock(state_->mutex);
    if (state_->stop)
      throw Error("the loader's worker threads were shut down (close() was called)");
    state_->job = std::move(job);
    ++state_->generation;
  }
  state_->changed.notify_all();
}

bool Executor::shutdown(std::chrono::milliseconds deadline) {
  if (threads_.empty()) return true;
  if (in_forked_child()) {
    // The threads do not exist here and a lock may be held forever: let go
    // of the handles without touching the shared state.
    for (std::thread& thread : threads_) thread.detach();
    threads_.clear();
    // The state is never destroyed here: destroying a condition variable
    // that the parent's (absent) threads wait on can block forever.
    static_cast<void>(new std::shared_ptr<State>(std::move(state_)));
    return false;
  }
  bool all_exited = false;
  std::shared_ptr<Job> last_job;  // released after the lock: it may free a Source
  {
    std::unique_lock lock(state_->mutex);
    state_->stop = true;
    if (state_->job != nullptr) state_->job->cancel();
    state_->changed.notify_all();
    all_exited = state_->idle.wait_for(lock, deadline, [&] { return state_->alive == 0; });
    last_job = std::move(state_->job);
  }
  for (std::thread& thread : threads_) {
    if (all_exited) {
      thread.join();
    } else {
      thread.detach();
    }
  }
  threads_.clear();
  return all_exited;
}

}  // namespace leanloader
