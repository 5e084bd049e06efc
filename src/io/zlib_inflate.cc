#include "io/zlib_inflate.h"

#include <libdeflate.h>

namespace leanloader::detail {

InflateResult zlib_inflate(std::span<const std::byte> in, std::span<std::byte> out,
                           size_t& produced) {
  struct Decompressor {
    libdeflate_decompressor* handle = libdeflate_alloc_decompressor();
    ~Decompressor() { libdeflate_free_decompressor(handle); }
  };
  thread_local Decompressor decompressor;
  produced = 0;
  if (decompressor.handle == nullptr) return InflateResult::kOutOfMemory;
  switch (libdeflate_zlib_decompress(decompressor.handle, in.data(), in.size(), out.data(),
                                     out.size(), &produced)) {
    case LIBDEFLATE_SUCCESS:
      return InflateResult::kOk;
    case LIBDEFLATE_INSUFFICIENT_SPACE:
      return InflateResult::kNoRoom;
    default:
      return InflateResult::kCorrupt;
  }
}

}  // namespace leanloader::detail
