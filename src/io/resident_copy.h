// Copies out of a file mapping when the bytes are already in memory. Internal.
//
// A source reading rows of a file can pread them (one system call; a row not
// in the page cache is noticed with RWF_NOWAIT, so the loader can announce
// the next rows and keep many reads in flight) or copy them from a mapping of
// the file. The kernel's copy of a pread writes through the cache; a copy
// from the mapping can use streaming stores (io/streaming_copy.h), which is
// faster for batches larger than the cache. copy_if_resident takes the
// mapping when every page of the range is in the page cache (mincore: one
// system call per MiB of the range), and says so otherwise, so that the
// caller preads the range and keeps its storage path.
#pragma once

#include <cstddef>
#include <span>

#include "io/file_io.h"
#include "io/streaming_copy.h"
#include "leanloader/core/storage.h"

namespace leanloader::detail {

enum class ResidentCopy {
  kCopied,       // dst holds the bytes
  kNotResident,  // part of the range is not in memory: nothing was copied
  kGone,         // the file lost pages of the range since it was mapped
};

// Whether every page of [mapped, mapped + bytes) (inside a file mapping) is
// in the page cache: one mincore call per MiB. False where it cannot be told.
bool is_resident(const std::byte* mapped, size_t bytes) noexcept;

// Copies `bytes` from `mapped` (inside a file mapping) to `dst` with
// `stores` when every page of the range is resident.
ResidentCopy copy_if_resident(void* dst, const std::byte* mapped, size_t bytes,
                              Stores stores) noexcept;

// File::read_exact_noting_misses(offset, dst) (false: part of the range had
// to come from storage), except that with streaming stores a range whose
// pages are all resident is copied from `mapping` (the same file, mapped
// whole) instead. A range the mapping no longer holds is pread, which
// reports what the file holds now.
bool read_noting_misses(const File& file, const MappedFile& mapping, size_t offset,
                        std::span<std::byte> dst, Stores stores);

}  // namespace leanloader::detail
