// A warning the user should hear about, with what it is about: the front end
// picks its category by the kind (Python: a RuntimeWarning, or for an image
// above the pixel limit a DecompressionBombWarning, as Pillow warns).
#pragma once

#include <string>
#include <utility>

namespace leanloader {

enum class WarningKind {
  kGeneral,     // RuntimeWarning
  kPixelLimit,  // an image above max_pixels, decoded: DecompressionBombWarning
};

struct Warning {
  // Implicit from a message: most warnings are general.
  Warning(std::string text, WarningKind what = WarningKind::kGeneral)  // NOLINT
      : message(std::move(text)), kind(what) {}

  std::string message;
  WarningKind kind;
};

}  // namespace leanloader
