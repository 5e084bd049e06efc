// Unsigned integers stored in a given byte order, read from unaligned bytes
// (image headers and chunk lengths). Internal.
#pragma once

#include <cstddef>
#include <cstdint>

namespace leanloader::detail {

inline uint32_t load_u16(const std::byte* p, bool big_endian) {
  const auto a = static_cast<uint32_t>(p[0]), b = static_cast<uint32_t>(p[1]);
  return big_endian ? (a << 8) | b : (b << 8) | a;
}

inline uint32_t load_u32(const std::byte* p, bool big_endian) {
  const uint32_t first = load_u16(p, big_endian), second = load_u16(p + 2, big_endian);
  return big_endian ? (first << 16) | second : (second << 16) | first;
}

}  // namespace leanloader::detail
