#include "leanloader/workers/shared_arena.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <utility>

#include "core/page_size.h"
#include "io/proc_maps.h"
#include "leanloader/core/checked_size.h"
#include "leanloader/core/error.h"
#include "workers/shared_file.h"

namespace leanloader {

namespace {

std::atomic<uint64_t> fork_count{0};

void count_fork() noexcept { fork_count.fetch_add(1, std::memory_order_relaxed); }

// Installed once, with the first arena: forks before any arena exists cannot
// map an arena's range.
void count_forks_from_now() {
  static const bool installed = [] {
    // In the parent after each fork(): the child may now map every range
    // that exists.
    return ::pthread_atfork(nullptr, &count_fork, nullptr) == 0;
  }();
  if (!installed) throw Error("cannot register a fork handler (pthread_atfork)", ErrorKind::kIo);
}

using detail::page_size;

}  // namespace

uint64_t forks_of_this_process() noexcept { return fork_count.load(std::memory_order_relaxed); }

void forget_fork_of_a_child_that_reads_no_released_range() noexcept {
  uint64_t forks = fork_count.load(std::memory_order_relaxed);
  // Never below zero: a fork made before the handler was installed was not counted.
  while (forks > 0 &&
         !fork_count.compare_exchange_weak(forks, forks - 1, std::memory_order_relaxed)) {
  }
}

SharedArena::SharedArena(std::shared_ptr<const SharedFile> file) : file_(std::move(file)) {
  struct stat st {};
  if (::fstat(file_->fd, &st) == 0) {
    device_ = static_cast<uint64_t>(st.st_dev);
    inode_ = static_cast<uint64_t>(st.st_ino);
  }
}

std::shared_ptr<SharedArena> SharedArena::create(const std::string& dir_arg) {
  count_forks_from_now();
  const std::string dir = dir_arg.empty() ? default_shm_dir() : dir_arg;
  auto file = detail::create_shared_file(dir, 0, SharedSegment::Reserve::kLater);
  return std::shared_ptr<SharedArena>(new SharedArena(std::move(file)));
}

std::shared_ptr<SharedSegment> SharedArena::allocate(size_t size, SharedSegment::Reserve reserve) {
  if (size == 0) throw InvalidArgument("a shared memory segment needs a size above 0");
  const size_t page = page_size();
  const auto length = checked_round_up(size, page);
  size_t offset = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    punch_unmapped_locked();
    const auto end = length ? checked_add(end_, *length) : std::nullopt;
    if (!end || *end > static_cast<size_t>(INT64_MAX)) {
      throw InvalidArgument("a shared memory arena cannot grow by " + std::to_string(size) +
                            " bytes past " + std::to_string(end_));
    }
    offset = end_;
    end_ = *end;
    // The file grows to its new end first (a range past the end cannot be
    // mapped); the range's pages are reserved below or by the caller.
    if (::ftruncate(file_->fd, static_cast<off_t>(end_)) != 0) {
      throw IoError("cannot grow shared memory arena to " + std::to_string(end_) + " bytes",
                    file_->path, errno);
    }
  }
  if (reserve == SharedSegment::Reserve::kNow) detail::reserve_range(*file_, offset, *length);
  void* data = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, file_->fd,
                      static_cast<off_t>(offset));
  if (data == MAP_FAILED) {
    const int error_number = errno;
    release(offset, *length, forks_of_this_process(), false);
    throw IoError("cannot map shared memory segment", file_->path, error_number);
  }
  return SharedSegment::over_range(static_cast<std::byte*>(data), size, file_, offset,
                                   shared_from_this());
}

size_t SharedArena::file_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return end_;
}

size_t SharedArena::held_back_ranges() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return held_.size() + never_punched_;
}

void SharedArena::release(size_t file_offset, size_t length, uint64_t forks_at_creation,
                          bool mapped_privately) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  if (forks_at_creation != forks_of_this_process()) {
    ++never_punched_;  // a child forked since may map it
  } else if (mapped_privately) {
    held_.push_back({file_offset, length, forks_at_creation});
  } else {
    punch_locked(file_offset, length);
  }
  if (!held_.empty()) punch_unmapped_locked();
}

void SharedArena::punch_unmapped_locked() noexcept {
  if (held_.empty()) return;
  std::vector<detail::ProcessMapping> mappings;
  try {
    mappings = detail::read_process_mappings();
  } catch (...) {
    return;  // checked again at the next allocation or release
  }
  const uint64_t forks = forks_of_this_process();
  std::vector<HeldRange> still_held;
  for (const HeldRange& range : held_) {
    bool mapped = false;
    for (const detail::ProcessMapping& mapping : mappings) {
      if (mapping.inode != inode_ || mapping.device != device_) continue;
      const uint64_t mapping_end = mapping.offset + (mapping.end - mapping.start);
      if (mapping.offset < range.offset + range.length && range.offset < mapping_end) {
        mapped = true;
        break;
      }
    }
    if (mapped) {
      still_held.push_back(range);
    } else if (forks != range.forks_at_creation) {
      ++never_punched_;  // a child forked while the pages were mapped may map them still
    } else {
      punch_locked(range.offset, range.length);
    }
  }
  held_ = std::move(still_held);
}

void SharedArena::punch_locked(size_t file_offset, size_t length) noexcept {
  // Best effort: a file system without hole punching keeps the pages until
  // the arena's file goes.
  (void)::fallocate(file_->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                    static_cast<off_t>(file_offset), static_cast<off_t>(length));
}

}  // namespace leanloader
