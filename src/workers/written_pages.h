// Whether a page-shared copy still equals its source, told by comparing only
// the pages the source wrote since. Internal.
//
// make_shared_copy (leanloader/workers/shared_copy.h) maps a block's
// page-aligned interior privately from the file range of its copy. Until the
// process writes a page there, that page *is* the copy's page (a file page in
// /proc/self/pagemap, or not yet faulted in); a write makes it an anonymous
// private page. So where /proc/self/maps still shows the interior mapped
// privately from the same file range that the copy maps, the source equals
// the copy when its partial end pages and its anonymous pages do: 88 MB left
// unwritten took 3.7 ms of /proc reads on the 2-core VM, where a compare of
// every byte costs 0.12-0.18 s per GiB on the hosts measured.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>

namespace leanloader::detail {

// Calls `visit(page_address)` for each page overlapping [start, end) that
// this process wrote since it was mapped from a file: anonymous in
// /proc/self/pagemap (present or swapped, not a file page: bits 63, 62 and
// 61), in address order, until `visit` returns false. Returns false, having
// visited nothing, when /proc/self/pagemap cannot be read, and when a read
// of it falls short (after the pages visited until then).
bool for_each_written_page(uintptr_t start, uintptr_t end,
                           const std::function<bool(uintptr_t)>& visit);

// Whether the `bytes` bytes at `source` equal those at `copy`, when the
// mappings show the relation above (the two at the same offset in their
// pages; the source's page-aligned interior, at least one page, mapped
// privately from the file range the copy's pages are mapped from); nullopt
// when they do not, or /proc/self/pagemap cannot be read (the caller then
// compares every byte). Reads /proc/self/maps once: meant for blocks of
// megabytes. A page written by another thread during the call may or may
// not be seen, as with any compare.
std::optional<bool> equal_where_written(const void* source, const void* copy, size_t bytes);

}  // namespace leanloader::detail
