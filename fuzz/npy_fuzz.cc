// libFuzzer target: .npy bytes end to end. The bytes are parsed as a header
// and then opened as a file through NpySource, whose rows are read into
// buffers the way the loader reads them (pread of C-order rows, gathers of
// Fortran-order ones). A leanloader::Error is the only acceptable failure;
// anything else (a crash, a sanitizer report, another exception) is a bug.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "leanloader/core/checked_size.h"
#include "leanloader/core/error.h"
#include "leanloader/io/npy_format.h"
#include "leanloader/sources/npy_source.h"

namespace {

// Destinations on the heap, as big as the source asks (within reason: a
// real slot would have been planned from the same checked sizes).
class BufferWriter final : public leanloader::SampleWriter {
 public:
  std::span<std::byte> field_buffer(size_t field, const leanloader::Shape& shape) override {
    const auto& spec = fields_->at(field);
    const std::optional<size_t> bytes = leanloader::checked_nbytes(shape, spec.dtype);
    if (!bytes || *bytes > (size_t{16} << 20)) {
      throw leanloader::InvalidArgument("row too large for the fuzz buffer");
    }
    buffers_.emplace_back(*bytes);
    return buffers_.back();
  }
  explicit BufferWriter(const std::vector<leanloader::FieldSpec>& fields) : fields_(&fields) {}

 private:
  const std::vector<leanloader::FieldSpec>* fields_;
  std::vector<std::vector<std::byte>> buffers_;
};

// The bytes as a file NpySource can open by path, without touching the disk.
class MemoryFile {
 public:
  MemoryFile(const uint8_t* data, size_t size) : fd_(::memfd_create("npy_fuzz", 0)) {
    size_t written = 0;
    while (fd_ >= 0 && written < size) {
      const ssize_t n = ::write(fd_, data + written, size - written);
      if (n <= 0) break;
      written += static_cast<size_t>(n);
    }
  }
  ~MemoryFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  MemoryFile(const MemoryFile&) = delete;
  MemoryFile& operator=(const MemoryFile&) = delete;
  bool ok() const { return fd_ >= 0; }
  std::string path() const { return "/proc/self/fd/" + std::to_string(fd_); }

 private:
  int fd_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    (void)leanloader::parse_npy_header(bytes, "fuzz.npy");
  } catch (const leanloader::FormatError&) {
    return 0;  // the file below would be rejected the same way
  }
  MemoryFile file(data, size);
  if (!file.ok()) return 0;
  try {
    const auto source = leanloader::NpySource::from_arrays({{"x", file.path()}});
    const int64_t rows = source->size();
    for (const int64_t row : {int64_t{0}, rows / 2, rows - 1}) {
      if (row < 0 || row >= rows) continue;
      BufferWriter writer(source->fields());
      source->read_sample(row, writer);
    }
  } catch (const leanloader::Error&) {
  }
  return 0;
}
