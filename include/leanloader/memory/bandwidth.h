// Bandwidth: this machine's memcpy speed, the yardstick for batch assembly.
//
// Assembling a batch from cached data is a gather-copy, so its ceiling is the
// memcpy bandwidth available to the same number of threads. The benchmark
// harness measures it in the same run as the loaders it compares (the host is
// shared and drifts by 10-20%, see research/limits.md) and quotes the loader's
// throughput as a fraction of it.
#pragma once

#include <cstddef>

namespace leanloader {

// Returns the bytes copied per second (bytes, not GB) when `threads`
// std::threads each copy their own `bytes_per_thread` buffer at the same
// time: threads * bytes_per_thread divided by the wall time from the first
// thread's start to the last thread's end. Buffers are allocated and
// prefaulted before timing; one untimed warm-up pass precedes `repeats` timed
// passes, and the median pass is taken. Measured twice, with memcpy and with
// streaming stores (detail::copy_with_streaming_stores), and the faster copy
// is returned: the ceiling for a batch assembled by either.
//
// Throws InvalidArgument when threads < 1, bytes_per_thread == 0 or
// repeats < 1, and OutOfMemory when the buffers cannot be allocated.
// Thread-safe; it allocates 2 * threads * bytes_per_thread bytes while it runs.
double measure_memcpy_bandwidth(int threads, size_t bytes_per_thread, int repeats);

// Copies `bytes` from `src` to `dst` as a loader fills a batch slot of that
// size: streaming stores from the size where the loader uses them (a large
// share of the last-level cache), memcpy below. For yardsticks that copy
// whole batches (the bench's copy-and-read), so they copy as well as the
// loader they are set against. The ranges must not overlap.
void copy_as_batch_slot(void* dst, const void* src, size_t bytes) noexcept;

}  // namespace leanloader
