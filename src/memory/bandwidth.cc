#include "leanloader/memory/bandwidth.h"

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "io/streaming_copy.h"
#include "leanloader/core/error.h"
#include "leanloader/core/storage.h"

namespace leanloader {

namespace {

using Clock = std::chrono::steady_clock;

// The two copies timed: glibc's memcpy and streaming stores.
constexpr detail::Stores kCopies[] = {detail::Stores::kCached, detail::Stores::kStreaming};
constexpr size_t kCopyCount = std::size(kCopies);

// One copying thread's buffers and the times of its passes, for each copy in
// turn (pass p of copy c at c * passes + p).
struct CopyLane {
  std::shared_ptr<HeapStorage> source;
  std::shared_ptr<HeapStorage> destination;
  std::vector<Clock::time_point> starts;
  std::vector<Clock::time_point> ends;
};

// The median rate of the timed passes of copy `copy` (pass 0 of each copy is
// its warm-up).
double median_rate(const std::vector<CopyLane>& lanes, size_t copy, int passes,
                   double bytes_per_pass) {
  std::vector<double> rates;
  rates.reserve(static_cast<size_t>(passes - 1));
  for (int pass = 1; pass < passes; ++pass) {
    const size_t index = copy * static_cast<size_t>(passes) + static_cast<size_t>(pass);
    Clock::time_point first_start = lanes.front().starts[index];
    Clock::time_point last_end = lanes.front().ends[index];
    for (const CopyLane& lane : lanes) {
      first_start = std::min(first_start, lane.starts[index]);
      last_end = std::max(last_end, lane.ends[index]);
    }
    // A pass shorter than the clock's resolution still yields a finite rate.
    const double seconds =
        std::max(std::chrono::duration<double>(last_end - first_start).count(), 1e-9);
    rates.push_back(bytes_per_pass / seconds);
  }
  const auto middle = rates.begin() + static_cast<std::ptrdiff_t>(rates.size() / 2);
  std::nth_element(rates.begin(), middle, rates.end());
  return *middle;
}

}  // namespace

double measure_memcpy_bandwidth(int threads, size_t bytes_per_thread, int repeats) {
  if (threads < 1) {
    throw InvalidArgument("measure_memcpy_bandwidth: threads must be >= 1, got " +
                          std::to_string(threads));
  }
  if (bytes_per_thread == 0) {
    throw InvalidArgument("measure_memcpy_bandwidth: bytes_per_thread must be > 0");
  }
  if (repeats < 1) {
    throw InvalidArgument("measure_memcpy_bandwidth: repeats must be >= 1, got " +
                          std::to_string(repeats));
  }

  // glibc's memcpy picks streaming stores only above a size it derives from
  // the cache it believes the CPU has: on an EPYC VM it counted every core
  // complex's L3 (256 MiB) and copied 64 MiB buffers with cached stores,
  // 4.5-5.4 GB/s on two threads where streaming stores copy 7.1-9.2. The
  // yardstick is the faster copy, so that a loader's share of it is not
  // flattered by a slow memcpy. Both are timed on the same buffers.
  const int passes = repeats + 1;  // pass 0 of each copy is its warm-up
  const size_t timed = kCopyCount * static_cast<size_t>(passes);
  std::vector<CopyLane> lanes(static_cast<size_t>(threads));
  for (CopyLane& lane : lanes) {
    lane.source = HeapStorage::allocate(bytes_per_thread);
    lane.destination = HeapStorage::allocate(bytes_per_thread);
    lane.starts.resize(timed);
    lane.ends.resize(timed);
  }

  // Every pass starts with all threads released together, so the passes
  // measure concurrent copies sharing the memory bus, as a loader's threads do.
  std::barrier pass_start(threads);
  {
    std::vector<std::jthread> workers;
    workers.reserve(lanes.size());
    for (CopyLane& lane : lanes) {
      workers.emplace_back([&lane, &pass_start, timed, passes, bytes_per_thread] {
        // Prefault both buffers on the thread that uses them (first touch
        // places the pages on this thread's NUMA node).
        std::memset(lane.source->data(), 0x5a, bytes_per_thread);
        std::memset(lane.destination->data(), 0, bytes_per_thread);
        for (size_t index = 0; index < timed; ++index) {
          const detail::Stores stores = kCopies[index / static_cast<size_t>(passes)];
          pass_start.arrive_and_wait();
          lane.starts[index] = Clock::now();
          detail::copy_with(stores, lane.destination->data(), lane.source->data(),
                            bytes_per_thread);
          lane.ends[index] = Clock::now();
        }
      });
    }
  }  // jthreads join here

  const double bytes_per_pass = static_cast<double>(bytes_per_thread) * threads;
  double fastest = 0;
  for (size_t copy = 0; copy < kCopyCount; ++copy) {
    fastest = std::max(fastest, median_rate(lanes, copy, passes, bytes_per_pass));
  }
  return fastest;
}

void copy_as_batch_slot(void* dst, const void* src, size_t bytes) noexcept {
  detail::copy_with(bytes >= detail::streaming_batch_bytes() ? detail::Stores::kStreaming
                                                             : detail::Stores::kCached,
                    dst, src, bytes);
}

}  // namespace leanloader
