#include "leanloader/workers/task_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <set>
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

TEST(TaskPool, CloseHandsBackTasksThatNeverStarted) {
  TaskPool pool(1);
  std::atomic<bool> started{false};
  std::atomic<bool> release{false};
  pool.submit([&](int) {
    started = true;
    while (!release) std::this_thread::sleep_for(milliseconds(1));
  });
  while (!started) std::this_thread::sleep_for(milliseconds(1));
  for (int i = 0; i < 5; ++i) pool.submit([](int) {});
  release = true;
  const auto unstarted = pool.close();
  EXPECT_EQ(unstarted.size(), 5u);
  EXPECT_THROW(pool.submit([](int) {}), Error);
  EXPECT_TRUE(pool.close().empty());  // idempotent
}

}  // namespace
}  // namespace leanloader
