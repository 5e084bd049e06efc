// The C++ tests' replacement of the global operator new (allocation_hooks.cc):
// counts allocations, and fails allocations of one size on demand.
#pragma once

#include <atomic>
#include <cstddef>

namespace leanloader::testing {

// Allocations through operator new, on every thread, since the program
// started. Differences over a stretch of code count what it allocated
// (other threads of the test's own making aside).
size_t allocation_count() noexcept;

// While not 0, an allocation of exactly this many bytes throws
// std::bad_alloc, as a real failure would: pick a size no other code asks for.
extern std::atomic<size_t> failing_allocation_bytes;
// Allocations failed that way.
extern std::atomic<int> failed_allocations;

}  // namespace leanloader::testing
