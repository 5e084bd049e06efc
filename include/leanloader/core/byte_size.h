// Byte sizes written by people: "4GiB", "512MB", "1.5 GB", "1024".
#pragma once

#include <cstddef>
#include <string>

namespace leanloader {

// Parses a byte size: a decimal number, optional spaces, and a unit (B, KB,
// MB, GB, TB, KiB, MiB, GiB, TiB; case-insensitive; none = bytes). Throws
// InvalidArgument for anything else, naming the text.
size_t parse_byte_size(const std::string& text);

}  // namespace leanloader
