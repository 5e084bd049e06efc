#include "leanloader/sources/file_source.h"

#include <sys/stat.h>

#include <algorithm>

#include "io/file_io.h"
#include "leanloader/core/error.h"

namespace leanloader {

namespace {

// Files stat'ed to estimate a typical sample size (for slot sizing).
constexpr size_t kSizeProbe = 32;

}  // namespace

FileSource::FileSource(std::vector<std::string> paths) : paths_(std::move(paths)) {
  if (paths_.empty()) throw InvalidArgument("FileSource needs at least one file");
  specs_.push_back({"data", DType::kU8, std::nullopt});
  size_t total = 0, seen = 0;
  const size_t step = std::max<size_t>(1, paths_.size() / kSizeProbe);
  for (size_t i = 0; i < paths_.size() && seen < kSizeProbe; i += step) {
    struct stat st {};
    if (::stat(paths_[i].c_str(), &st) == 0) {
      total += static_cast<size_t>(st.st_size);
      ++seen;
    }
  }
  estimated_bytes_ = seen == 0 ? 4096 : std::max<size_t>(1, total / seen);
}

void FileSource::read_sample(int64_t index, SampleWriter& writer) const {
  if (index < 0 || index >= size()) {
    throw InvalidArgument("index " + std::to_string(index) + " out of range for " +
                          std::to_string(size()) + " samples");
  }
  const detail::File file(paths_[static_cast<size_t>(index)]);
  const std::span<std::byte> dst = writer.field_buffer(0, {static_cast<int64_t>(file.size())});
  file.read_exact(0, dst);
}

std::string FileSource::describe() const {
  return "FileSource(" + std::to_string(paths_.size()) + " files, first '" + paths_.front() + "')";
}

}  // namespace leanloader
