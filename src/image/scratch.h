// Per-thread scratch buffers of the image pipeline. Internal.
//
// Each worker thread keeps its buffers (file bytes, decoded pixels, resize
// outputs) between samples, so steady state allocates nothing; a buffer that
// grew past kScratchKeepBytes for one large image is released when the sample
// is done, so a rare huge image does not stay resident in every thread.
#pragma once

#include <cstddef>
#include <vector>

namespace leanloader::detail {

inline constexpr size_t kScratchKeepBytes = size_t{64} << 20;

// Releases `buffers` that hold more than kScratchKeepBytes when it dies.
template <class T, size_t N>
class ScratchTrim {
 public:
  explicit ScratchTrim(std::vector<T>* (&&buffers)[N]) {
    for (size_t i = 0; i < N; ++i) buffers_[i] = buffers[i];
  }
  ~ScratchTrim() {
    for (std::vector<T>* buffer : buffers_) {
      if (buffer->capacity() * sizeof(T) > kScratchKeepBytes) std::vector<T>().swap(*buffer);
    }
  }
  ScratchTrim(const ScratchTrim&) = delete;
  ScratchTrim& operator=(const ScratchTrim&) = delete;

 private:
  std::vector<T>* buffers_[N];
};

// Sizes a scratch buffer to `count` elements whose old contents are not
// needed: a buffer too small is freed first and allocated at exactly `count`
// (vector::resize would hold the old and the new one at once while it
// copies, and grow to as much as twice `count`), so that a thread holds at
// most what its largest sample needs — the figure the memory bill counts.
template <class T>
void resize_scratch(std::vector<T>& buffer, size_t count) {
  if (count > buffer.capacity()) std::vector<T>().swap(buffer);
  buffer.resize(count);
}

}  // namespace leanloader::detail
