// libFuzzer target for the TensorCache manifest parser: arbitrary bytes are a
// manifest.json. The only acceptable failure is FormatError; a manifest that
// parses must satisfy the invariants readers rely on and survive a round
// trip through the formatter unchanged.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "leanloader/cache/cache_manifest.h"
#include "leanloader/core/error.h"

namespace {

void check(bool condition) {
  if (!condition) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  leanloader::CacheManifest manifest;
  try {
    manifest = leanloader::parse_cache_manifest(text, "fuzz/manifest.json");
  } catch (const leanloader::FormatError&) {
    return 0;
  }
  for (const auto& shard : manifest.shards) {
    check(!shard.file.empty() && shard.file.find('/') == std::string::npos &&
          shard.file.front() != '.');
  }
  for (const auto& entry : manifest.entries) {
    check(entry.shard < manifest.shards.size());
    for (const auto& tensor : entry.tensors) {
      check(tensor.offset + tensor.nbytes <= manifest.shards[entry.shard].bytes);
    }
  }
  const std::string again = leanloader::format_cache_manifest(manifest);
  const leanloader::CacheManifest reparsed =
      leanloader::parse_cache_manifest(again, "fuzz/manifest.json");
  check(leanloader::format_cache_manifest(reparsed) == again);
  return 0;
}
