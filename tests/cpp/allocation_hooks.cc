#include "allocation_hooks.h"

#include <cstdlib>
#include <new>

namespace leanloader::testing {

std::atomic<size_t> failing_allocation_bytes{0};
std::atomic<int> failed_allocations{0};

namespace {
std::atomic<size_t> g_allocations{0};
}  // namespace

size_t allocation_count() noexcept { return g_allocations.load(std::memory_order_relaxed); }

}  // namespace leanloader::testing

// Replacing the global operator new is allowed in a program; it serves every
// allocation with malloc, as the default one does. The array and aligned
// forms call these, so they are counted too.
void* operator new(size_t size) {
  using leanloader::testing::failing_allocation_bytes;
  leanloader::testing::g_allocations.fetch_add(1, std::memory_order_relaxed);
  const size_t failing = failing_allocation_bytes.load(std::memory_order_relaxed);
  if (failing != 0 && size == failing) {
    ++leanloader::testing::failed_allocations;
    throw std::bad_alloc();
  }
  if (void* memory = std::malloc(size == 0 ? 1 : size)) return memory;
  throw std::bad_alloc();
}
// GCC sees free() of what it knows as operator new's memory; here operator
// new is ours and takes it from malloc.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
void operator delete(void* memory) noexcept { std::free(memory); }
void operator delete(void* memory, size_t /*size*/) noexcept { std::free(memory); }
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
