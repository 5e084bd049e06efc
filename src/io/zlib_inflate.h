// zlib streams inflated whole through libdeflate (2-3x zlib's speed), one
// decompressor per calling thread, kept for the thread's life. Internal.
#pragma once

#include <cstddef>
#include <span>

namespace leanloader::detail {

enum class InflateResult {
  kOk,           // `produced` bytes written
  kNoRoom,       // the stream inflates past out.size()
  kCorrupt,      // not a valid zlib stream
  kOutOfMemory,  // no decompressor could be allocated
};

InflateResult zlib_inflate(std::span<const std::byte> in, std::span<std::byte> out,
                           size_t& produced);

}  // namespace leanloader::detail
