#include "io/proc_maps.h"

#include <sys/sysmacros.h>

#include <charconv>
#include <fstream>
#include <sstream>

namespace leanloader::detail {

namespace {

// The next space-separated field of `rest` (advanced past it), or "".
std::string_view next_field(std::string_view& rest) {
  const size_t begin = rest.find_first_not_of(' ');
  if (begin == std::string_view::npos) {
    rest = {};
    return {};
  }
  rest.remove_prefix(begin);
  const size_t end = std::min(rest.find(' '), rest.size());
  const std::string_view field = rest.substr(0, end);
  rest.remove_prefix(end);
  return field;
}

template <typename T>
bool parse_number(std::string_view text, T& out, int base) {
  if (text.empty()) return false;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), out, base);
  return error == std::errc() && end == text.data() + text.size();
}

// "<hex>-<hex>" or "<hex>:<hex>".
bool parse_pair(std::string_view text, char separator, uint64_t& first, uint64_t& second) {
  const size_t at = text.find(separator);
  return at != std::string_view::npos && parse_number(text.substr(0, at), first, 16) &&
         parse_number(text.substr(at + 1), second, 16);
}

}  // namespace

std::optional<MapsLine> parse_maps_line(std::string_view line) {
  std::string_view rest = line;
  MapsLine parsed;
  uint64_t start = 0;
  uint64_t end = 0;
  if (!parse_pair(next_field(rest), '-', start, end)) return std::nullopt;
  parsed.start = static_cast<uintptr_t>(start);
  parsed.end = static_cast<uintptr_t>(end);
  parsed.perms = next_field(rest);
  if (parsed.perms.size() != 4) return std::nullopt;
  if (!parse_number(next_field(rest), parsed.offset, 16)) return std::nullopt;
  if (!parse_pair(next_field(rest), ':', parsed.major, parsed.minor)) return std::nullopt;
  if (!parse_number(next_field(rest), parsed.inode, 10)) return std::nullopt;
  const size_t path = rest.find_first_not_of(' ');
  parsed.path = path == std::string_view::npos ? std::string_view() : rest.substr(path);
  return parsed;
}

std::vector<ProcessMapping> read_process_mappings() {
  std::ifstream maps("/proc/self/maps");
  std::vector<ProcessMapping> mappings;
  std::string line;
  while (std::getline(maps, line)) {
    const auto parsed = parse_maps_line(line);
    if (!parsed) continue;
    mappings.push_back({parsed->start, parsed->end, std::string(parsed->perms), parsed->offset,
                        static_cast<uint64_t>(makedev(parsed->major, parsed->minor)), parsed->inode,
                        std::string(parsed->path)});
  }
  return mappings;
}

}  // namespace leanloader::detail
