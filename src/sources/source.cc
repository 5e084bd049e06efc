#include "leanloader/sources/source.h"

namespace leanloader {

std::optional<size_t> find_field(const Source& source, const std::string& name) {
  const auto& fields = source.fields();
  for (size_t i = 0; i < fields.size(); ++i) {
    if (fields[i].name == name) return i;
  }
  return std::nullopt;
}

}  // namespace leanloader
