#include "io/resident_copy.h"

#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <cstdint>

#include "core/page_size.h"
#include "io/guarded_copy.h"
#include "leanloader/core/checked_size.h"

namespace leanloader::detail {

namespace {

// Pages asked about per mincore call: 1 MiB of 4 KiB pages, on the stack.
constexpr size_t kPagesPerQuery = 256;

}  // namespace

bool is_resident(const std::byte* mapped, size_t bytes) noexcept {
  const size_t page = page_size();
  const auto address = reinterpret_cast<uintptr_t>(mapped);
  uintptr_t first = address / page * page;
  const uintptr_t end = address + bytes;
  std::array<unsigned char, kPagesPerQuery> resident{};
  while (first < end) {
    const size_t pages = std::min<size_t>(kPagesPerQuery, (end - first + page - 1) / page);
    // ENOMEM (not mapped) or any other failure: not known to be resident.
    if (::mincore(reinterpret_cast<void*>(first), pages * page, resident.data()) != 0) {
      return false;
    }
    for (size_t i = 0; i < pages; ++i) {
      if ((resident[i] & 1) == 0) return false;
    }
    first += pages * page;
  }
  return true;
}

ResidentCopy copy_if_resident(void* dst, const std::byte* mapped, size_t bytes,
                              Stores stores) noexcept {
  if (!is_resident(mapped, bytes)) return ResidentCopy::kNotResident;
  // Pages can still go between the question and the copy (reclaim): the copy
  // then faults them in from the file, correct and only slower. A file
  // truncated since it was mapped raises SIGBUS, which guarded_copy reports.
  return guarded_copy(dst, mapped, bytes, stores) ? ResidentCopy::kCopied : ResidentCopy::kGone;
}

bool read_noting_misses(const File& file, const MappedFile& mapping, size_t offset,
                        std::span<std::byte> dst, Stores stores) {
  if (stores == Stores::kStreaming && range_fits(offset, dst.size(), mapping.size()) &&
      mapped_bytes_still_in_file(file, mapping.size(), offset + dst.size()) &&
      copy_if_resident(dst.data(), mapping.data() + offset, dst.size(), stores) ==
          ResidentCopy::kCopied) {
    return true;
  }
  return file.read_exact_noting_misses(offset, dst);
}

}  // namespace leanloader::detail
