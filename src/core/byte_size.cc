#include "leanloader/core/byte_size.h"

#include <cctype>
#include <cmath>
#include <exception>

#include "leanloader/core/error.h"

namespace leanloader {

size_t parse_byte_size(const std::string& text) {
  size_t pos = 0;
  while (pos < text.size() && std::isspace(static_cast<unsigned char>(text[pos]))) ++pos;
  const size_t number_start = pos;
  while (pos < text.size() &&
         (std::isdigit(static_cast<unsigned char>(text[pos])) || text[pos] == '.')) {
    ++pos;
  }
  if (pos == number_start) throw InvalidArgument("not a byte size: '" + text + "'");
  // The number must be consumed whole: "1.2.3" is not 1.2 bytes.
  const std::string number = text.substr(number_start, pos - number_start);
  double value = 0;
  size_t consumed = 0;
  try {
    value = std::stod(number, &consumed);
  } catch (const std::exception&) {
    throw InvalidArgument("not a byte size: '" + text + "'");
  }
  if (consumed != number.size()) throw InvalidArgument("not a byte size: '" + text + "'");
  while (pos < text.size() && std::isspace(static_cast<unsigned char>(text[pos]))) ++pos;
  std::string unit;
  for (; pos < text.size(); ++pos) unit += static_cast<char>(std::tolower(text[pos]));
  struct Unit {
    const char* name;
    double factor;
  };
  static constexpr Unit kUnits[] = {
      {"", 1},
      {"b", 1},
      {"k", 1e3},
      {"kb", 1e3},
      {"m", 1e6},
      {"mb", 1e6},
      {"g", 1e9},
      {"gb", 1e9},
      {"t", 1e12},
      {"tb", 1e12},
      {"kib", 1024.0},
      {"mib", 1048576.0},
      {"gib", 1073741824.0},
      {"tib", 1099511627776.0},
  };
  for (const Unit& candidate : kUnits) {
    if (unit == candidate.name) {
      const double bytes = value * candidate.factor;
      if (!std::isfinite(bytes) || bytes >= 1.8e19) {
        throw InvalidArgument("byte size out of range: '" + text + "'");
      }
      return static_cast<size_t>(bytes);
    }
  }
  throw InvalidArgument("unknown unit in byte size '" + text +
                        "' (use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)");
}

}  // namespace leanloader
