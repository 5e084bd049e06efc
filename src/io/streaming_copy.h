// A copy whose destination bypasses the CPU caches. Internal.
//
// memcpy writes through the cache: each destination line is first read from
// memory (read-for-ownership), then written back when evicted, so a copy far
// larger than the cache moves three bytes over the memory bus for each byte
// copied. Non-temporal ("streaming") stores write whole lines straight to
// memory: two bytes per byte copied, and the cache keeps what the other
// threads were using. That pays when nothing reads the destination before it
// would have left the cache anyway: a batch of several MiB assembled by one
// thread and read later by the consumer (measured on the `arrays` bench, 256
// KiB rows into 16 MiB batches, 2 threads: 4.9 -> 6.3 GB/s). For a small
// destination read at once, memcpy is the better copy.
#pragma once

#include <cstddef>

namespace leanloader::detail {

// How a copy writes its destination.
enum class Stores {
  kCached,     // memcpy
  kStreaming,  // non-temporal stores (x86-64; memcpy elsewhere and under TSan)
};

// Batch slots at least this large may be filled with streaming stores: larger
// than any core's L2 cache, and with a batch or two in flight per thread a
// large share of a usual server's L3 (32 MiB a CCX), so a cached copy would
// be evicted before the consumer reads it.
inline constexpr size_t kStreamingBatchBytes = size_t{4} << 20;

// The slot size from which batches are filled with streaming stores on this
// machine: kStreamingBatchBytes, or an eighth of the last-level cache where
// that is more. Where the cache holds the batches in flight, the consumer
// reads them from it and cached stores are faster (a Xeon with 480 MiB of
// L3, 256 KiB rows into 16 MiB batches: 7.1-7.5 GB/s streaming, 9.4-9.8
// cached). Read once (last_level_cache_bytes).
size_t streaming_batch_bytes() noexcept;

// The L3 cache this CPU shares with others, as the kernel describes it
// (sysfs: cpu0's level-3 cache); sysconf's figure where sysfs has none; 0
// when neither knows. Not sysconf first: glibc adds up every L3 of the
// package from CPUID, which on AMD parts with one L3 per core complex is
// many times what a core can use (the 2-core EPYC VM: 256 MiB from sysconf,
// 32 MiB in sysfs; 16 MiB batches were then filled with cached stores,
// 3.4-4.0 GB/s for 256 KiB rows where streaming stores give 4.6-5.0).
size_t last_level_cache_bytes() noexcept;

// memcpy(dst, src, bytes) with non-temporal stores for the 64-byte lines of
// `dst` (its unaligned head and tail are copied with memcpy), fenced, so the
// bytes are visible to other threads once the copy returns. The ranges must
// not overlap.
void copy_with_streaming_stores(void* dst, const void* src, size_t bytes) noexcept;

// Asks the CPU to start loading the first 512 bytes of [src, src + bytes)
// into its cache (prefetch instructions: no fault, no system call; an
// address that is not mapped is ignored). Measured on 4 KiB rows of a
// shuffled pass hinted one row ahead (Source::will_read), 2 threads: on the
// AMD VM, no consumer, the first 4 KiB against none: 1.31 -> 1.39 million
// rows/s (+6%); on the Xeon host, `bench arrays --only leanloader-4KiB`
// (the consumer reads every byte), 3 alternating pairs each: none 45-46% of
// memcpy, 4 KiB 46-48%, 128-256 bytes 52-53%, 512 bytes 52-54%, 1 KiB 51%.
// 64 KiB and 256 KiB rows: no difference (72-78% either way).
void prefetch_for_copy(const void* src, size_t bytes) noexcept;

// copy_with_streaming_stores or memcpy, as `stores` says.
void copy_with(Stores stores, void* dst, const void* src, size_t bytes) noexcept;

}  // namespace leanloader::detail
