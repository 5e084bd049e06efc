#include "pipeline/prefetch_window.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <deque>
#include <thread>

#include "leanloader/pipeline/loader.h"

namespace leanloader {
namespace {

using namespace std::chrono_literals;
using detail::PrefetchWindow;

constexpr uint64_t kNsPerMs = 1'000'000;

TEST(PrefetchWindowTest, DeepensOnlyWhenTheConsumerWaitsAfterThreadsWereHeldBack) {
  PrefetchWindow window(nullptr, 0, 3, 2, true);
  EXPECT_EQ(window.window(), 1);  // double buffering to start with
  uint64_t held_back = 0;         // the threads' window waits so far, summed

  EXPECT_FALSE(window.consumer_waits(held_back));  // nothing held back: producer-bound
  EXPECT_EQ(window.window(), 1);

  std::this_thread::sleep_for(20ms);
  held_back += 1 * kNsPerMs;  // 1 of 2 x 20 thread-ms: under 5%
  EXPECT_FALSE(window.consumer_waits(held_back));
  EXPECT_EQ(window.window(), 1);

  held_back += 1000 * kNsPerMs;  // held back most of the time, then a wait
  EXPECT_TRUE(window.consumer_waits(held_back));
  EXPECT_EQ(window.window(), 2);
  held_back += 1000 * kNsPerMs;
  EXPECT_TRUE(window.consumer_waits(held_back));
  EXPECT_EQ(window.window(), 3);
  held_back += 1000 * kNsPerMs;
  EXPECT_FALSE(window.consumer_waits(held_back));  // never past prefetch
  EXPECT_EQ(window.window(), 3);
}

TEST(PrefetchWindowTest, HeldBackTimeIsUsedUpByTheWaitItExplains) {
  PrefetchWindow window(nullptr, 0, 3, 2, true);
  const uint64_t held_back = 1000 * kNsPerMs;
  EXPECT_TRUE(window.consumer_waits(held_back));
  EXPECT_EQ(window.window(), 2);
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(window.consumer_waits(held_back))
      << "the earlier held-back time was counted already";
  EXPECT_EQ(window.window(), 2);
}

TEST(PrefetchWindowTest, FixedDepthWhenNotAdaptive) {
  PrefetchWindow window(nullptr, 0, 3, 2, false);
  EXPECT_EQ(window.window(), 3);
  EXPECT_FALSE(window.consumer_waits(0));
  EXPECT_EQ(window.window(), 3);
}

// Sample i is its index, read in `pace`: a producer of known speed.
class PacedSource final : public Source {
 public:
  PacedSource(int64_t size, std::chrono::microseconds pace)
      : size_(size), pace_(pace), fields_{{"id", DType::kI64, Shape{}}} {}
  int64_t size() const override { return size_; }
  const std::vector<FieldSpec>& fields() const override { return fields_; }
  void read_sample(int64_t index, SampleWriter& writer) const override {
    std::this_thread::sleep_for(pace_);
    std::span<std::byte> out = writer.field_buffer(0, Shape{});
    std::memcpy(out.data(), &index, sizeof index);
  }
  std::string describe() const override { return "PacedSource"; }
  std::string sample_location(int64_t index) const override { return std::to_string(index); }
  size_t estimated_sample_bytes() const override { return sizeof(int64_t); }

 private:
  int64_t size_;
  std::chrono::microseconds pace_;
  std::vector<FieldSpec> fields_;
};

LoaderOptions paced_options(int64_t batch_size, int prefetch) {
  LoaderOptions o;
  o.batch_size = batch_size;
  o.num_threads = 2;
  o.prefetch = prefetch;
  return o;
}

TEST(PrefetchWindowTest, AProducerBoundLoaderStaysDoubleBuffered) {
  // 96 samples of 6 ms on 2 threads: ~288 ms a batch; the consumer takes
  // each at once and drops it when it takes the next, as a `for` loop does,
  // polling with short timeouts as the Python iterator does (one wait each).
  // The threads are held back only while the consumer wakes for a finished
  // batch: on a busy host that can take 10 ms, which must stay well under the
  // 5% of a batch's time that deepens the window.
  Loader loader(std::make_shared<PacedSource>(96 * 4, 6ms), paced_options(96, 2));
  auto iterator = loader.iterate();
  Batch batch;
  int batches = 0;
  int timeouts = 0;
  for (;;) {
    const auto status = iterator->next(batch, 5ms);
    if (status == EpochIterator::Status::kTimeout) {
      ++timeouts;
      continue;
    }
    if (status != EpochIterator::Status::kBatch) break;
    EXPECT_TRUE(batch.warnings.empty());
    ++batches;
  }
  EXPECT_GT(timeouts, 4);
  EXPECT_EQ(batches, 4);
  const LoaderStats stats = loader.stats();
  EXPECT_EQ(stats.window, 1);
  EXPECT_EQ(stats.resident_bytes, 2 * stats.slot_bytes) << "one slot filled, one held";
  EXPECT_EQ(stats.planned_bytes, 4 * stats.slot_bytes) << "the bill stays the planned cap";
  EXPECT_EQ(stats.overflow_slots_total, 0u);
}

TEST(PrefetchWindowTest, AConsumerWhoseStepsVaryDeepensTheWindow) {
  // ~8 ms a batch; the consumer alternates a 40 ms step with an instant one:
  // threads wait at the window during the long step, then the consumer
  // waits after the short one.
  Loader loader(std::make_shared<PacedSource>(16 * 12, 1ms), paced_options(16, 2));
  auto iterator = loader.iterate();
  Batch batch;
  int batches = 0;
  while (iterator->next(batch, 10s) == EpochIterator::Status::kBatch) {
    if (++batches % 2 == 1) std::this_thread::sleep_for(40ms);
  }
  EXPECT_EQ(batches, 12);
  const LoaderStats stats = loader.stats();
  EXPECT_EQ(stats.window, 2);
  EXPECT_LE(stats.resident_bytes, stats.planned_bytes);
  EXPECT_EQ(stats.overflow_slots_total, 0u);
}

TEST(PrefetchWindowTest, AConsumerKeepingTwoBatchesGetsAThirdSlotNotAnOverflow) {
  Loader loader(std::make_shared<PacedSource>(8 * 8, 200us), paced_options(8, 2));
  auto iterator = loader.iterate();
  std::deque<Batch> kept;
  Batch batch;
  while (iterator->next(batch, 10s) == EpochIterator::Status::kBatch) {
    EXPECT_TRUE(batch.warnings.empty());
    kept.push_back(std::move(batch));
    if (kept.size() > 2) kept.pop_front();
  }
  const LoaderStats stats = loader.stats();
  EXPECT_EQ(stats.overflow_slots_total, 0u);
  EXPECT_GE(stats.resident_bytes, 3 * stats.slot_bytes);
  EXPECT_LE(stats.resident_bytes, stats.planned_bytes);
}

}  // namespace
}  // namespace leanloader
