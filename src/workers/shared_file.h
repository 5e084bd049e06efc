// The files behind shared memory segments: how they are made without a name
// and how their pages are reserved, shared by SharedSegment and SharedArena.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "leanloader/workers/shared_segment.h"

namespace leanloader::detail {

// A new file of shared memory with no name anywhere, in `dir` (a memfd when
// empty), `size` bytes long (0: empty), its pages reserved with
// posix_fallocate (kNow) or only its length set (kLater). Throws IoError;
// ENOSPC and ENOMEM name the directory and its free space.
std::shared_ptr<const SharedFile> create_shared_file(const std::string& dir, size_t size,
                                                     SharedSegment::Reserve reserve);

// Reserves [offset, offset + bytes) of `file` (growing it as needed), so
// that writing those pages cannot raise SIGBUS. Throws as above.
void reserve_range(const SharedFile& file, size_t offset, size_t bytes);

// The ENOSPC (or, for a memfd, ENOMEM) error of a reservation of `size`
// bytes in `dir` ("" for a memfd), with what a user needs to fix it.
[[noreturn]] void throw_no_space(const std::string& dir, size_t size);

}  // namespace leanloader::detail
