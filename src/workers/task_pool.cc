#include "leanloader/workers/task_pool.h"

#include <condition_variable>
#include <mutex>
#include <set>
#include <utility>

#include "leanloader/core/error.h"

namespace leanloader {

struct TaskPool::Queue {
  std::mutex mutex;
  std::condition_variable work_ready;
  std::condition_variable task_done;
  std::deque<std::pair<int64_t, Task>> pending;
  std::set<int64_t> finished;
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
        queue_->work_ready.wait(lock, [&] { return queue_->stopping || !queue_->pending.empty(); });
        if (queue_->stopping) return;
        task = std::move(queue_->pending.front());
        queue_->pending.pop_front();
      }
      task.second(worker);  // tasks store their own outcome and do not throw
      task.second = nullptr;
      {
        std::lock_guard lock(queue_->mutex);
        if (!queue_->stopping) queue_->finished.insert(task.first);
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
  executor_.run(std::make_shared<Worker>(queue_));
}

TaskPool::~TaskPool() { close(); }

int64_t TaskPool::submit(Task task) {
  std::lock_guard lock(queue_->mutex);
  if (queue_->stopping) throw Error("the thread pool is closed");
  const int64_t id = next_id_++;
  queue_->pending.emplace_back(id, std::move(task));
  queue_->work_ready.notify_one();
  return id;
}

bool TaskPool::wait(int64_t id, std::chrono::milliseconds timeout) {
  std::unique_lock lock(queue_->mutex);
  const bool done =
      queue_->task_done.wait_for(lock, timeout, [&] { return queue_->finished.count(id) > 0; });
  if (done) queue_->finished.erase(id);
  return done;
}

std::deque<TaskPool::Task> TaskPool::close(std::chrono::milliseconds deadline) {
  executor_.shutdown(deadline);
  std::deque<Task> unstarted;
  std::lock_guard lock(queue_->mutex);
  queue_->stopping = true;
  for (auto& entry : queue_->pending) unstarted.push_back(std::move(entry.second));
  queue_->pending.clear();
  queue_->finished.clear();
  return unstarted;
}

}  // namespace leanloader
