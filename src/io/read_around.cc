#include "io/read_around.h"

#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <algorithm>
#include <bit>
#include <fstream>
#include <string>

namespace leanloader::detail {

namespace {

size_t read_ahead_kb_at(const std::string& path) noexcept {
  std::ifstream in(path);
  size_t kib = 0;
  if (!(in >> kib)) return 0;
  return kib;
}

}  // namespace

size_t device_read_ahead_bytes(int fd) noexcept {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return 0;
  const std::string device =
      "/sys/dev/block/" + std::to_string(major(st.st_dev)) + ":" + std::to_string(minor(st.st_dev));
  // A disk has queue/; a partition's directory sits inside its disk's.
  size_t kib = read_ahead_kb_at(device + "/queue/read_ahead_kb");
  if (kib == 0) kib = read_ahead_kb_at(device + "/../queue/read_ahead_kb");
  return kib * 1024;
}

ReadAround::ReadAround(std::shared_ptr<const File> file, size_t begin, size_t end,
                       size_t window_bytes, std::chrono::milliseconds reannounce_after)
    : file_(std::move(file)),
      begin_(begin),
      end_(end),
      window_(window_bytes),
      windows_(end > begin ? (end - 1) / window_bytes - begin / window_bytes + 1 : 0),
      reannounce_ms_(static_cast<uint32_t>(reannounce_after.count())),
      created_(std::chrono::steady_clock::now()),
      announced_at_(std::make_unique<std::atomic<uint32_t>[]>(windows_)) {}

std::unique_ptr<ReadAround> ReadAround::for_rows(std::shared_ptr<const File> file, size_t begin,
                                                 size_t end, size_t row_bytes,
                                                 uint64_t available_memory) {
  const size_t read_ahead = std::bit_floor(device_read_ahead_bytes(file->fd()));
  if (read_ahead <= row_bytes || end <= begin) return nullptr;
  if (end - begin > available_memory / 2) return nullptr;
  return std::make_unique<ReadAround>(std::move(file), begin, end, read_ahead);
}

uint32_t ReadAround::now_ms() const noexcept {
  const auto elapsed = std::chrono::steady_clock::now() - created_;
  // Wraps after 49 days: a window is then announced once too often.
  return static_cast<uint32_t>(
             std::chrono::duration_cast<std::chrono::milliseconds>(elapsed).count()) +
         1;
}

size_t ReadAround::announce(size_t offset) const noexcept {
  if (offset < begin_ || offset >= end_) return 0;
  std::atomic<uint32_t>& announced_at = announced_at_[offset / window_ - begin_ / window_];
  const uint32_t now = now_ms();
  uint32_t last = announced_at.load(std::memory_order_relaxed);
  if (last != 0 && now - last < reannounce_ms_) return 0;
  // One thread announces; the others see its time.
  if (!announced_at.compare_exchange_strong(last, now, std::memory_order_relaxed)) return 0;
  const size_t start = std::max(begin_, (offset / window_) * window_);
  const size_t stop = std::min(end_, (offset / window_ + 1) * window_);
  file_->will_need(start, stop - start);
  return stop - start;
}

}  // namespace leanloader::detail
