// libFuzzer target: the .npy header parser on arbitrary bytes. A FormatError
// is the only acceptable failure; anything else (a crash, a sanitizer report,
// another exception) is a bug.
#include <cstddef>
#include <cstdint>
#include <span>

#include "leanloader/core/error.h"
#include "leanloader/io/npy_format.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    const leanloader::NpyHeader header = leanloader::parse_npy_header(bytes, "fuzz.npy");
    // A parsed header must describe a layout we can size without overflow
    // (or be rejected by shape_numel with InvalidArgument).
    try {
      (void)leanloader::shape_numel(header.shape);
    } catch (const leanloader::InvalidArgument&) {
    }
  } catch (const leanloader::FormatError&) {
  }
  return 0;
}
