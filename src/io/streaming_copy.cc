#include "io/streaming_copy.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>

// ThreadSanitizer sees memcpy (it intercepts it) but not the stores of SSE
// intrinsics: its builds copy with memcpy, so that a race on a batch's bytes
// stays visible to it.
#if defined(__SANITIZE_THREAD__)
#define LEANLOADER_STREAMING_STORES 0
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define LEANLOADER_STREAMING_STORES 0
#endif
#endif
#if !defined(LEANLOADER_STREAMING_STORES) && defined(__x86_64__)
#define LEANLOADER_STREAMING_STORES 1
#elif !defined(LEANLOADER_STREAMING_STORES)
#define LEANLOADER_STREAMING_STORES 0
#endif

#if LEANLOADER_STREAMING_STORES
#include <emmintrin.h>
#endif

namespace leanloader::detail {

size_t last_level_cache_bytes() noexcept {
  for (int index = 0; index < 8; ++index) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index);
    std::ifstream level_file(dir + "/level");
    std::ifstream size_file(dir + "/size");
    int level = 0;
    size_t size = 0;
    char unit = 0;
    if (!(level_file >> level) || level != 3 || !(size_file >> size)) continue;
    if (size_file >> unit) size <<= unit == 'K' ? 10 : unit == 'M' ? 20 : 0;
    if (size > 0) return size;
  }
  const long last_level = ::sysconf(_SC_LEVEL3_CACHE_SIZE);
  return last_level > 0 ? static_cast<size_t>(last_level) : 0;
}

void copy_with_streaming_stores(void* dst, const void* src, size_t bytes) noexcept {
#if LEANLOADER_STREAMING_STORES
  constexpr size_t kLine = 64;
  auto* out = static_cast<std::byte*>(dst);
  const auto* in = static_cast<const std::byte*>(src);
  // Streaming stores of partial lines would be slower than cached ones: the
  // unaligned head goes through memcpy, then whole lines.
  const size_t head = std::min(bytes, (kLine - reinterpret_cast<uintptr_t>(out) % kLine) % kLine);
  std::memcpy(out, in, head);
  out += head;
  in += head;
  bytes -= head;
  // SSE2 is part of x86-64: no dispatch. Wider stores fill the same
  // write-combining buffers no faster; the loads are unaligned (a row's
  // source offset is the file's).
  for (const std::byte* end = in + bytes / kLine * kLine; in != end; in += kLine, out += kLine) {
    const auto* from = reinterpret_cast<const __m128i*>(in);
    auto* to = reinterpret_cast<__m128i*>(out);
    const __m128i a = _mm_loadu_si128(from);
    const __m128i b = _mm_loadu_si128(from + 1);
    const __m128i c = _mm_loadu_si128(from + 2);
    const __m128i d = _mm_loadu_si128(from + 3);
    _mm_stream_si128(to, a);
    _mm_stream_si128(to + 1, b);
    _mm_stream_si128(to + 2, c);
    _mm_stream_si128(to + 3, d);
  }
  // Streaming stores are weakly ordered: fence them before whoever publishes
  // the batch (a release store on this thread) can be seen.
  _mm_sfence();
  std::memcpy(out, in, bytes % kLine);
#else
  std::memcpy(dst, src, bytes);
#endif
}

size_t streaming_batch_bytes() noexcept {
  static const size_t bytes = [] {
    const size_t last_level = last_level_cache_bytes();
    return std::max(kStreamingBatchBytes, last_level / 8);
  }();
  return bytes;
}

void prefetch_for_copy(const void* src, size_t bytes) noexcept {
  // The first 8 lines: the row's first memory accesses start a row early,
  // and the hardware's stream prefetcher follows the rest of the page once
  // the copy reads in sequence. Prefetching the whole first 4 KiB page (64
  // lines back to back) filled the core's line-fill buffers and stalled the
  // thread in the prefetch loop (perf, 4 KiB rows, Xeon host: 67% of the
  // samples on the instruction after the prefetch).
  constexpr size_t kLine = 64;
  constexpr size_t kMostBytes = 512;
  const auto* first = static_cast<const std::byte*>(src);
  const std::byte* end = first + std::min(bytes, kMostBytes);
  for (const std::byte* line = first; line < end; line += kLine) __builtin_prefetch(line);
}

void copy_with(Stores stores, void* dst, const void* src, size_t bytes) noexcept {
  if (stores == Stores::kStreaming) {
    copy_with_streaming_stores(dst, src, bytes);
  } else {
    std::memcpy(dst, src, bytes);
  }
}

}  // namespace leanloader::detail
