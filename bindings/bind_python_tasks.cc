// PythonTaskPool: Python functions called on the engine's TaskPool threads,
// for `ll.DataLoader(worker_mode="thread")`. Glue only: the queue, the
// threads and the waiting live in leanloader::TaskPool.
//
// GIL contract: a worker takes the GIL only while it calls the function and
// stores the outcome; every Python reference is created and dropped with the
// GIL held. The consumer waits with the GIL released, in short slices, so
// Ctrl-C is seen promptly.
#include <nanobind/nanobind.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <map>
#include <memory>
#include <vector>

#include "bindings.h"
#include "leanloader/core/error.h"
#include "leanloader/workers/task_pool.h"

namespace nb = nanobind;

namespace leanloader::bindings {

namespace {

constexpr std::chrono::milliseconds kSignalCheckInterval(50);

// One call and its outcome. Every member is touched only with the GIL held.
struct PythonCall {
  nb::object function;
  nb::object argument;
  nb::object value;
  nb::object error;        // the exception instance (with its __traceback__), or null
  bool abandoned = false;  // the pool was closed: nobody will claim the outcome
};

bool python_is_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}

void run_call(PythonCall& call, int worker) {
  // A thread asking for the GIL once finalization has begun is ended by
  // CPython (pthread_exit). The exit handler in thread_iter.py closes the
  // pools before that; this narrows what a call outliving it can hit.
  if (!Py_IsInitialized() || python_is_finalizing()) return;
  nb::gil_scoped_acquire gil;
  try {
    call.value = call.function(call.argument, worker);
  } catch (nb::python_error& error) {
    call.error = nb::borrow(error.value());
  } catch (const std::exception& error) {
    call.error = nb::steal(PyObject_CallFunction(PyExc_RuntimeError, "s", error.what()));
  }
  call.function.reset();
  call.argument.reset();
  if (call.abandoned) {
    call.value.reset();
    call.error.reset();
  }
}

// Calls `poll` (which waits up to kSignalCheckInterval, GIL released) until
// it returns true; checks for Ctrl-C between calls, and raises TimeoutError
// after `timeout_s` seconds (<= 0: waits forever).
template <typename Poll>
void wait_interruptibly(double timeout_s, Poll poll) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(timeout_s));
  while (true) {
    bool done = false;
    {
      nb::gil_scoped_release release;
      done = poll();
    }
    if (done) return;
    if (PyErr_CheckSignals() != 0) throw nb::python_error();
    if (timeout_s > 0 && std::chrono::steady_clock::now() > deadline) {
      throw TimeoutError("no result from the thread pool within " + std::to_string(timeout_s) +
                         " s");
    }
  }
}

class PythonTaskPool {
 public:
  explicit PythonTaskPool(int num_threads) : pool_(num_threads) {}
  ~PythonTaskPool() { close(); }

  // Queues function(argument, worker_index) for any thread, or for thread
  // `worker` alone (>= 0: run before any shared task); returns the task's id.
  int64_t submit(nb::object function, nb::object argument, int worker) {
    auto call = std::make_shared<PythonCall>();
    call->function = std::move(function);
    call->argument = std::move(argument);
    TaskPool::Task task = [call](int ran_on) { run_call(*call, ran_on); };
    const int64_t id =
        worker < 0 ? pool_.submit(std::move(task)) : pool_.submit_to(worker, std::move(task));
    calls_.emplace(id, std::move(call));
    return id;
  }

  // The function's return value for task `id`, or its exception re-raised.
  // Raises TimeoutError after `timeout_s` seconds (<= 0: wait forever).
  nb::object result(int64_t id, double timeout_s) {
    auto entry = calls_.find(id);
    if (entry == calls_.end()) throw InvalidArgument("no task " + std::to_string(id));
    wait_interruptibly(timeout_s, [&] { return pool_.wait(id, kSignalCheckInterval); });
    std::shared_ptr<PythonCall> call = std::move(entry->second);
    calls_.erase(entry);
    if (call->error.is_valid()) {
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(call->error.ptr())), call->error.ptr());
      throw nb::python_error();
    }
    return std::move(call->value);
  }

  // The id of the first task of `ids` that has finished (claim its outcome
  // with result()). Raises TimeoutError after `timeout_s` seconds (<= 0:
  // wait forever).
  int64_t wait_any(const std::vector<int64_t>& ids, double timeout_s) {
    int64_t found = -1;
    wait_interruptibly(timeout_s, [&] {
      found = pool_.wait_any(ids, kSignalCheckInterval);
      return found >= 0;
    });
    return found;
  }

  // Stops the threads (those inside a call finish it first, up to a
  // deadline) and drops the tasks that never ran. Idempotent.
  void close() {
    std::deque<TaskPool::Task> unstarted;
    {
      nb::gil_scoped_release release;  // a worker may need the GIL to finish
      unstarted = pool_.close();
    }
    // Outcomes nobody will claim are dropped here, GIL held; a call still
    // running past the deadline drops its own (it checks `abandoned` under
    // the GIL).
    for (auto& [id, call] : calls_) {
      call->abandoned = true;
      call->value.reset();
      call->error.reset();
    }
    calls_.clear();
    // `unstarted` releases its calls here, GIL held.
  }

 private:
  TaskPool pool_;
  std::map<int64_t, std::shared_ptr<PythonCall>> calls_;  // touched with the GIL held
};

}  // namespace

void bind_python_tasks(nb::module_& m) {
  nb::class_<PythonTaskPool>(m, "PythonTaskPool",
                             "Native threads that call Python functions (worker_mode='thread').")
      .def(nb::init<int>(), nb::arg("num_threads"))
      .def("submit", &PythonTaskPool::submit, nb::arg("function"), nb::arg("argument"),
           nb::arg("worker") = -1,
           "Queues function(argument, worker_index) for any thread, or for thread `worker` "
           "alone (run before any shared task); returns the task's id.")
      .def("result", &PythonTaskPool::result, nb::arg("id"), nb::arg("timeout") = 0.0,
           "The task's return value, or its exception re-raised.")
      .def("wait_any", &PythonTaskPool::wait_any, nb::arg("ids"), nb::arg("timeout") = 0.0,
           "The id of the first of `ids` whose task has finished (claim it with result()).")
      .def("close", &PythonTaskPool::close);
}

}  // namespace leanloader::bindings
