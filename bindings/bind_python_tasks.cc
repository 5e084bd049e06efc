// PythonTaskPool: native-owned threads (leanloader's Executor) that call
// Python functions, for `ll.DataLoader(worker_mode="thread")`.
//
// Contract: a worker takes the GIL only while it calls the function and
// stores the outcome; it waits for work without it. The consumer waits for a
// result with the GIL released, in short slices, so Ctrl-C is seen promptly.
// Every Python reference is created and dropped with the GIL held.
#include <nanobind/nanobind.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>

#include "bindings.h"
#include "leanloader/executor.h"

namespace nb = nanobind;

namespace leanloader::bindings {

namespace {

constexpr std::chrono::milliseconds kSignalCheckInterval(50);

struct PythonTask {
  int64_t id = 0;
  nb::object function;
  nb::object argument;
};

struct PythonOutcome {
  nb::object value;
  nb::object error;  // the exception instance (with its __traceback__), or null
};

struct TaskQueue {
  std::mutex mutex;
  std::condition_variable work_ready;
  std::condition_variable result_ready;
  std::deque<PythonTask> pending;
  std::map<int64_t, PythonOutcome> finished;
  bool stopping = false;
};

class PythonTaskJob final : public Job {
 public:
  explicit PythonTaskJob(std::shared_ptr<TaskQueue> queue) : queue_(std::move(queue)) {}

  void work(int /*worker*/) noexcept override {
    while (true) {
      PythonTask task;
      {
        std::unique_lock lock(queue_->mutex);
        queue_->work_ready.wait(lock, [&] { return queue_->stopping || !queue_->pending.empty(); });
        if (queue_->stopping) return;
        task = std::move(queue_->pending.front());
        queue_->pending.pop_front();
      }
      if (!Py_IsInitialized()) return;
      nb::gil_scoped_acquire gil;
      PythonOutcome outcome;
      try {
        outcome.value = task.function(task.argument);
      } catch (nb::python_error& error) {
        outcome.error = nb::borrow(error.value());
      } catch (const std::exception& error) {
        outcome.error = nb::steal(PyObject_CallFunction(PyExc_RuntimeError, "s", error.what()));
      }
      task.function.reset();
      task.argument.reset();
      {
        std::lock_guard lock(queue_->mutex);
        // After close() nobody will claim it: `outcome` is dropped below,
        // while this thread still holds the GIL.
        if (!queue_->stopping) queue_->finished.emplace(task.id, std::move(outcome));
      }
      queue_->result_ready.notify_all();
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
  std::shared_ptr<TaskQueue> queue_;
};

class PythonTaskPool {
 public:
  explicit PythonTaskPool(int num_threads)
      : queue_(std::make_shared<TaskQueue>()), executor_(num_threads) {
    executor_.run(std::make_shared<PythonTaskJob>(queue_));
  }
  ~PythonTaskPool() { close(); }

  int64_t submit(nb::object function, nb::object argument) {
    std::lock_guard lock(queue_->mutex);
    if (queue_->stopping) throw Error("the thread pool is closed");
    const int64_t id = next_id_++;
    queue_->pending.push_back({id, std::move(function), std::move(argument)});
    queue_->work_ready.notify_one();
    return id;
  }

  // The function's return value for task `id`, or its exception re-raised.
  // Raises TimeoutError after `timeout_s` seconds (<= 0: wait forever).
  nb::object result(int64_t id, double timeout_s) {
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(timeout_s));
    std::optional<PythonOutcome> outcome;  // moved in without touching refcounts
    while (true) {
      bool found = false;
      {
        nb::gil_scoped_release release;
        std::unique_lock lock(queue_->mutex);
        found = queue_->result_ready.wait_for(lock, kSignalCheckInterval,
                                              [&] { return queue_->finished.count(id) > 0; });
        if (found) {
          auto entry = queue_->finished.find(id);
          outcome.emplace(std::move(entry->second));
          queue_->finished.erase(entry);
        }
      }
      if (found) break;
      if (PyErr_CheckSignals() != 0) throw nb::python_error();
      if (timeout_s > 0 && std::chrono::steady_clock::now() > deadline) {
        throw TimeoutError("no result from the thread pool within " + std::to_string(timeout_s) +
                           " s");
      }
    }
    if (outcome->error.is_valid()) {
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(outcome->error.ptr())),
                      outcome->error.ptr());
      throw nb::python_error();
    }
    return std::move(outcome->value);
  }

  // Stops the threads (those inside a call finish it first, up to a
  // deadline) and drops the tasks that never ran. Idempotent.
  void close() {
    std::deque<PythonTask> unstarted;
    std::map<int64_t, PythonOutcome> unclaimed;
    {
      nb::gil_scoped_release release;  // a worker may need the GIL to finish
      executor_.shutdown(std::chrono::milliseconds(2000));
      std::lock_guard lock(queue_->mutex);
      unstarted.swap(queue_->pending);
      unclaimed.swap(queue_->finished);
    }
    // `unstarted` and `unclaimed` release their references here, GIL held.
  }

 private:
  std::shared_ptr<TaskQueue> queue_;
  Executor executor_;
  int64_t next_id_ = 0;
};

}  // namespace

void bind_python_tasks(nb::module_& m) {
  nb::class_<PythonTaskPool>(m, "PythonTaskPool",
                             "Native threads that call Python functions (worker_mode='thread').")
      .def(nb::init<int>(), nb::arg("num_threads"))
      .def("submit", &PythonTaskPool::submit, nb::arg("function"), nb::arg("argument"),
           "Queues function(argument); returns the task's id.")
      .def("result", &PythonTaskPool::result, nb::arg("id"), nb::arg("timeout") = 0.0,
           "The task's return value, or its exception re-raised.")
      .def("close", &PythonTaskPool::close);
}

}  // namespace leanloader::bindings
