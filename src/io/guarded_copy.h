// Copies out of a file mapping that survive the file shrinking underneath.
// Internal.
//
// Reading a mapped page that lies beyond the file's end (the file was
// truncated or rewritten in place after it was mapped) raises SIGBUS, which
// kills the process. guarded_copy() turns that into a false return for the
// calling thread: a SIGBUS handler, installed once and chained to whatever
// handler was there before, jumps back out of a copy that this thread marked
// as guarded; any other SIGBUS goes to the previous handler (or the default
// action) as if ours were not there. The fast path costs a sigsetjmp that
// saves no signal mask (no system call) and two thread-local stores.
#pragma once

#include <cstddef>

#include "io/streaming_copy.h"

namespace leanloader::detail {

// copy_with(stores, dst, src, bytes); false when reading `src` raised SIGBUS
// (dst is then partly written). `src` must be mapped memory; `dst` must not
// fault.
bool guarded_copy(void* dst, const void* src, size_t bytes,
                  Stores stores = Stores::kCached) noexcept;

// body(context) with the same guard, for reads of a mapping other than one
// copy (a strided gather); false when it raised SIGBUS. `body` is left by a
// jump then: it must own nothing a destructor would release.
bool guarded_call(void (*body)(void*), void* context) noexcept;

}  // namespace leanloader::detail
