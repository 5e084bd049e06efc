#include "leanloader/workers/task_pool.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <memory>
#include <mutex>
#include <numeric>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "leanloader/core/error.h"

namespace leanloader {
namespace {

using std::chrono::milliseconds;

TEST(TaskPool, RunsEveryTaskOnceAndReportsWorkerIndex) {
  TaskPool pool(3);
  constexpr int kTasks = 200;
  std::vector<std::atomic<int>> runs(kTasks);
  std::vector<std::atomic<int>> worker_of(kTasks);
  std::vector<int64_t> ids;
  for (int i = 0; i < kTasks; ++i) {
    ids.push_back(pool.submit([&, i](int worker) {
      ++runs[static_cast<size_t>(i)];
      worker_of[static_cast<size_t>(i)] = worker;
    }));
  }
  std::set<int> workers;
  for (int i = 0; i < kTasks; ++i) {
    ASSERT_TRUE(pool.wait(ids[static_cast<size_t>(i)], milliseconds(5000)));
    EXPECT_EQ(runs[static_cast<size_t>(i)].load(), 1);
    const int worker = worker_of[static_cast<size_t>(i)].load();
    EXPECT_GE(worker, 0);
    EXPECT_LT(worker, 3);
    workers.insert(worker);
  }
  EXPECT_FALSE(workers.empty());
}

// A pool copied into a forked child (a thread-mode loader the child's
// garbage collector finalizes) is closed there without touching what the
// parent's threads held: forks are made while its threads take and finish
// tasks, so some fork while one holds the queue's mutex. A close that took
// it hung the child; a submit there would wait on threads that do not exist.
TEST(TaskPool, AForkedChildClosesItsCopyWithoutWaitingAndRefusesWork) {
  TaskPool pool(4);
  std::atomic<bool> stop{false};
  std::thread feeder([&] {
    while (!stop.load()) {
      const int64_t id = pool.submit([](int) {});
      pool.wait(id, milliseconds(1000));
    }
  });
  for (int fork_number = 0; fork_number < 20; ++fork_number) {
    std::this_thread::sleep_for(milliseconds(2));
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      ::alarm(10);  // a close that hangs ends the child by SIGALRM
      int code = 3;
      try {
        pool.submit([](int) {});
      } catch (const Error& e) {
        code = std::string(e.what()).find("forked child") != std::string::npos ? 0 : 2;
      }
      pool.close();
      ::_exit(code);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status))
        << "fork " << fork_number << ": signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    EXPECT_EQ(WEXITSTATUS(status), 0) << "fork " << fork_number;
  }
  stop = true;
  feeder.join();
  const int64_t id = pool.submit([](int) {});
  EXPECT_TRUE(pool.wait(id, milliseconds(5000)));  // the parent's pool still works
}

TEST(TaskPool, ATaskThatThrowsHasItsErrorRethrownByWaitNotTerminate) {
  TaskPool pool(2);
  const int64_t failing = pool.submit([](int) { throw IoError("cannot read", "/x", 5); });
  std::atomic<int> ran{0};
  const int64_t fine = pool.submit([&](int) { ++ran; });
  EXPECT_THROW(pool.wait(failing, milliseconds(5000)), IoError);
  ASSERT_TRUE(pool.wait(fine, milliseconds(5000)));
  EXPECT_EQ(ran.load(), 1);
}

TEST(TaskPool, WaitTimesOutWhileTheTaskRuns) {
  TaskPool pool(1);
  std::atomic<bool> release{false};
  const int64_t id = pool.submit([&](int) {
    while (!release) std::this_thread::sleep_for(milliseconds(1));
  });
  EXPECT_FALSE(pool.wait(id, milliseconds(20)));
  release = true;
  EXPECT_TRUE(pool.wait(id, milliseconds(5000)));
}

TEST(TaskPool, CloseHandsBackTasksThatNeverStartedPinnedOrNot) {
  TaskPool pool(1);
  // Shared with the task: past close()'s deadline its thread is let go and
  // may read them after this test returned.
  auto started = std::make_shared<std::atomic<bool>>(false);
  auto release = std::make_shared<std::atomic<bool>>(false);
  pool.submit([started, release](int) {
    *started = true;
    while (!*release) std::this_thread::sleep_for(milliseconds(1));
  });
  while (!*started) std::this_thread::sleep_for(milliseconds(1));
  for (int i = 0; i < 5; ++i) pool.submit([](int) {});
  pool.submit_to(0, [](int) {});
  // The busy task outlasts close()'s deadline, so the thread can take
  // nothing more whatever the timing.
  const auto unstarted = pool.close(milliseconds(50));
  *release = true;
  EXPECT_EQ(unstarted.size(), 6u);
  EXPECT_THROW(pool.submit([](int) {}), Error);
  EXPECT_THROW(pool.submit_to(0, [](int) {}), Error);
  EXPECT_TRUE(pool.close().empty());  // idempotent
}

TEST(TaskPool, APinnedTaskRunsOnItsThreadBeforeTheSharedTasksQueuedEarlier) {
  // What the tasks touch is declared before the pool, so it outlives the
  // pool's threads however the test ends.
  std::atomic<int> started{0};
  std::atomic<bool> release{false};
  std::mutex mutex;
  std::vector<std::vector<int>> order(2);  // per thread: -1 pinned, else the shared task
  TaskPool pool(2);
  for (int i = 0; i < 2; ++i) {  // both threads busy
    pool.submit([&](int) {
      ++started;
      while (!release) std::this_thread::sleep_for(milliseconds(1));
    });
  }
  while (started < 2) std::this_thread::sleep_for(milliseconds(1));
  std::vector<int64_t> ids;
  for (int i = 0; i < 6; ++i) {
    ids.push_back(pool.submit([&, i](int worker) {
      std::lock_guard lock(mutex);
      order[static_cast<size_t>(worker)].push_back(i);
    }));
  }
  for (int worker = 0; worker < 2; ++worker) {
    ids.push_back(pool.submit_to(worker, [&, worker](int ran_on) {
      EXPECT_EQ(ran_on, worker);
      std::lock_guard lock(mutex);
      order[static_cast<size_t>(ran_on)].push_back(-1);
    }));
  }
  release = true;
  for (const int64_t id : ids) ASSERT_TRUE(pool.wait(id, milliseconds(5000)));
  for (const auto& ran : order) {
    ASSERT_FALSE(ran.empty());
    EXPECT_EQ(ran.front(), -1);  // each thread ran its own task before any shared one
  }
}

TEST(TaskPool, EveryThreadRunsItsPinnedTaskEvenWithNoSharedWork) {
  std::vector<std::atomic<int>> ran_on(3);
  for (auto& worker : ran_on) worker = -1;
  std::vector<int> order;  // touched by thread 1 only, read after the waits
  TaskPool pool(3);        // after what its tasks touch: its threads end first
  std::vector<int64_t> ids;
  for (int worker = 0; worker < 3; ++worker) {
    ids.push_back(pool.submit_to(
        worker, [&, worker](int thread) { ran_on[static_cast<size_t>(worker)] = thread; }));
  }
  for (const int64_t id : ids) ASSERT_TRUE(pool.wait(id, milliseconds(5000)));
  for (int worker = 0; worker < 3; ++worker) {
    EXPECT_EQ(ran_on[static_cast<size_t>(worker)].load(), worker);
  }
  // One thread's pinned tasks run in the order they were queued (the
  // DataLoader's worker_init_fn before its batches, its batches in order).
  ids.clear();
  for (int i = 0; i < 50; ++i) {
    ids.push_back(pool.submit_to(1, [&order, i](int) { order.push_back(i); }));
  }
  for (const int64_t id : ids) ASSERT_TRUE(pool.wait(id, milliseconds(5000)));
  std::vector<int> queued(50);
  std::iota(queued.begin(), queued.end(), 0);
  EXPECT_EQ(order, queued);
  EXPECT_THROW(pool.submit_to(3, [](int) {}), InvalidArgument);
  EXPECT_THROW(pool.submit_to(-1, [](int) {}), InvalidArgument);
}

TEST(TaskPool, WaitAnyNamesAFinishedTaskAndLeavesItToClaim) {
  std::atomic<bool> release{false};
  TaskPool pool(2);  // after what its tasks touch
  const int64_t slow = pool.submit_to(0, [&](int) {
    while (!release) std::this_thread::sleep_for(milliseconds(1));
  });
  const int64_t fast = pool.submit_to(1, [](int) {});
  const std::vector<int64_t> both{slow, fast};
  EXPECT_EQ(pool.wait_any(both, milliseconds(5000)), fast);
  EXPECT_EQ(pool.wait_any(both, milliseconds(5000)), fast);  // kept until claimed
  EXPECT_TRUE(pool.wait(fast, milliseconds(0)));
  const std::vector<int64_t> slow_only{slow};
  EXPECT_EQ(pool.wait_any(slow_only, milliseconds(20)), -1);  // still running
  release = true;
  EXPECT_EQ(pool.wait_any(slow_only, milliseconds(5000)), slow);
  EXPECT_TRUE(pool.wait(slow, milliseconds(0)));
}

}  // namespace
}  // namespace leanloader
