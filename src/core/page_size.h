// The system's memory page size. Internal.
#pragma once

#include <unistd.h>

#include <cstddef>

namespace leanloader::detail {

// sysconf(_SC_PAGESIZE), read once.
inline size_t page_size() noexcept {
  static const size_t size = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return size;
}

}  // namespace leanloader::detail
