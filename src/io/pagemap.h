// /proc/PID/pagemap: one 64-bit entry per virtual page (the kernel's
// admin-guide/mm/pagemap). One reader for the shared-copy rules (the pages
// this process wrote since it mapped a file) and the memory monitor (which
// pages of a held shared-memory file a process maps). Internal.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/file_io.h"
#include "leanloader/core/error.h"

namespace leanloader::detail {

constexpr uint64_t kPagePresent = uint64_t{1} << 63;
constexpr uint64_t kPageSwapped = uint64_t{1} << 62;
// A page of a file or of shared memory (shmem), not a private anonymous one.
// Readable without privileges (the frame number is not).
constexpr uint64_t kPageFileOrShared = uint64_t{1} << 61;

// Opens a /proc/PID/pagemap; null where it cannot be (the process has
// exited, or it is another user's).
inline std::unique_ptr<File> open_pagemap(const std::string& path) noexcept {
  try {
    return std::make_unique<File>(path);
  } catch (const Error&) {
    return nullptr;
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}

// Calls `visit(page_address, entry)` for each page overlapping [start, end),
// reading `pagemap` (an open /proc/PID/pagemap) a chunk at a time into
// `entries` (the caller's, reused across calls), until `visit` returns
// false. Returns false when a read falls short (after the pages visited
// until then), true otherwise.
template <typename Visit>
bool for_each_pagemap_entry(int pagemap, uintptr_t start, uintptr_t end, size_t page,
                            std::vector<uint64_t>& entries, Visit&& visit) {
  constexpr size_t kChunkPages = 4096;
  for (uintptr_t at = start / page * page; at < end;) {
    const size_t pages = std::min<size_t>(kChunkPages, (end - at + page - 1) / page);
    if (entries.size() < pages) entries.resize(pages);
    const ssize_t got = ::pread(pagemap, entries.data(), pages * sizeof(uint64_t),
                                static_cast<off_t>(at / page * sizeof(uint64_t)));
    if (got != static_cast<ssize_t>(pages * sizeof(uint64_t))) return false;
    for (size_t i = 0; i < pages; ++i) {
      if (!visit(at + i * page, entries[i])) return true;
    }
    at += pages * page;
  }
  return true;
}

}  // namespace leanloader::detail
