#include "leanloader/workers/task_pool.h"

#include <condition_variable>
#include <exception>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "leanloader/core/error.h"

namespace leanloader {

struct TaskPool::Queue {
  std::mutex mutex;
  std::condition_variable work_ready;
  std::condition_variable task_done;
  std::deque<std::pair<int64_t, Task>> pending;
  std::vector<std::deque<std::pair<int64_t, Task>>> pinned;  // one queue per thread
  std::set<int64_t> finished;
  // What a task let escape, against its contract, rethrown by wait(); and a
  // failure to record a completion at all (no memory), rethrown by every
  // wait(): either way an error in the caller instead of std::terminate.
  std::map<int64_t, std::exception_ptr> escaped;
  std::exception_ptr broken;
  bool stopping = false;
};

// The Job every worker thread runs for the pool's lifetime: take a task, run
// it, record its id as finished.
class TaskPool::Worker final : public Job {
 public:
  explicit Worker(std::shared_ptr<Queue> queue) : queue_(std::move(queue)) {}

  void work(int worker) noexcept override {
    while (true) {
      std::pair<int64_t, Task> task;
      {
        std::unique_lock lock(queue_->mutex);
        auto& own = queue_->pinned[static_cast<size_t>(worker)];
        queue_->work_ready.wait(
            lock, [&] { return queue_->stopping || !own.empty() || !queue_->pending.empty(); });
        if (queue_->stopping) return;
        auto& from = own.empty() ? queue_->pending : own;
        task = std::move(from.front());
        from.pop_front();
      }
      std::exception_ptr escaped;
      try {
        task.second(worker);  // tasks store their own outcome and should not throw
      } catch (...) {
        escaped = std::current_exception();
      }
      task.second = nullptr;
      {
        std::lock_guard lock(queue_->mutex);
        if (!queue_->stopping) {
          try {
            if (escaped) queue_->escaped.emplace(task.first, escaped);
            queue_->finished.insert(task.first);
          } catch (...) {
            queue_->broken = std::current_exception();
          }
        }
      }
      queue_->task_done.notify_all();
    }
  }

  void cancel() noexcept override {
    {
      std::lock_guard lock(queue_->mutex);
      queue_->stopping = true;
    }
    queue_->work_ready.notify_all();
  }

 private:
  std::shared_ptr<Queue> queue_;
};

TaskPool::TaskPool(int num_threads) : queue_(std::make_shared<Queue>()), executor_(num_threads) {
  queue_->pinned.resize(static_cast<size_t>(executor_.num_threads()));
  executor_.run(std::make_shared<Worker>(queue_));
}

TaskPool::~TaskPool() { close(); }

int64_t TaskPool::submit(Task task) { return enqueue(-1, std::move(task)); }

int64_t TaskPool::submit_to(int worker, Task task) {
  if (worker < 0 || worker >= num_threads()) {
    throw InvalidArgument("no worker thread " + std::to_string(worker) + " in a pool of " +
                          std::to_string(num_threads()));
  }
  return enqueue(worker, std::move(task));
}

void TaskPool::refuse_in_forked_child(const char* what) const {
  if (!executor_.in_forked_child()) return;
  throw Error(std::string("a thread pool cannot ") + what +
              " in a forked child (its threads exist only in the process that created it); "
              "create the loader inside the child");
}

int64_t TaskPool::enqueue(int worker, Task task) {
  refuse_in_forked_child("take tasks");
  std::lock_guard lock(queue_->mutex);
  if (queue_->stopping) throw Error("the thread pool is closed");
  const int64_t id = next_id_++;
  if (worker < 0) {
    queue_->pending.emplace_back(id, std::move(task));
    queue_->work_ready.notify_one();
  } else {
    queue_->pinned[static_cast<size_t>(worker)].emplace_back(id, std::move(task));
    // Every thread wakes: notify_one might wake another than the one that
    // may take it. (The others go back to sleep; with a handful of threads
    // that costs less than a condition variable per thread would complicate.)
    queue_->work_ready.notify_all();
  }
  return id;
}

bool TaskPool::wait(int64_t id, std::chrono::milliseconds timeout) {
  refuse_in_forked_child("be waited on");
  std::unique_lock lock(queue_->mutex);
  const bool done = queue_->task_done.wait_for(
      lock, timeout, [&] { return queue_->finished.count(id) > 0 || queue_->broken; });
  if (queue_->broken) std::rethrow_exception(queue_->broken);
  if (done) {
    queue_->finished.erase(id);
    const auto escaped = queue_->escaped.find(id);
    if (escaped != queue_->escaped.end()) {
      const std::exception_ptr cause = escaped->second;
      queue_->escaped.erase(escaped);
      std::rethrow_exception(cause);
    }
  }
  return done;
}

int64_t TaskPool::wait_any(std::span<const int64_t> ids, std::chrono::milliseconds timeout) {
  refuse_in_forked_child("be waited on");
  std::unique_lock lock(queue_->mutex);
  int64_t found = -1;
  queue_->task_done.wait_for(lock, timeout, [&] {
    if (queue_->broken) return true;
    for (const int64_t id : ids) {
      if (queue_->finished.count(id) > 0) {
        found = id;
        return true;
      }
    }
    return false;
  });
  if (queue_->broken) std::rethrow_exception(queue_->broken);
  return found;
}

std::deque<TaskPool::Task> TaskPool::close(std::chrono::milliseconds deadline) {
  const bool forked = executor_.in_forked_child();
  executor_.shutdown(deadline);
  if (forked) {
    // A pool inherited by a forked child (garbage a fork copied, closed by
    // a finalizer there): a thread of the parent may have held the mutex at
    // the fork, and the queues may be mid-change. Nothing here is touched:
    // the queue is let go of without being destroyed, its tasks with it.
    if (queue_ != nullptr) static_cast<void>(new std::shared_ptr<Queue>(std::move(queue_)));
    return {};
  }
  std::deque<Task> unstarted;
  std::lock_guard lock(queue_->mutex);
  queue_->stopping = true;
  for (auto& own : queue_->pinned) {
    for (auto& entry : own) unstarted.push_back(std::move(entry.second));
    own.clear();
  }
  for (auto& entry : queue_->pending) unstarted.push_back(std::move(entry.second));
  queue_->pending.clear();
  queue_->finished.clear();
  queue_->escaped.clear();
  return unstarted;
}

}  // namespace leanloader
