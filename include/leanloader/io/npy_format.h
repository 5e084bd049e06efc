// The .npy file format (NumPy's NEP 1): header parsing for untrusted bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "leanloader/core/dtype.h"
#include "leanloader/core/tensor.h"

namespace leanloader {

struct NpyHeader {
  DType dtype = DType::kU8;
  Shape shape;
  bool fortran_order = false;
  size_t data_offset = 0;  // bytes from the start of the file to the array data
};

// Parses the magic, version and header dict at the start of `bytes`
// (at least the header; the data need not be present). Throws FormatError
// naming `path` and the problem: bad magic, unsupported version, a header
// that is not the dict NumPy writes, a big-endian or structured dtype.
NpyHeader parse_npy_header(std::span<const std::byte> bytes, const std::string& path);

// Longest prefix parse_npy_header may need: magic + version + 4-byte length +
// NumPy's largest header; used to read only the header of a file.
inline constexpr size_t kNpyMaxHeaderBytes = 65536 + 12;

}  // namespace leanloader
