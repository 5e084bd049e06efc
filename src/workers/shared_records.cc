#include "leanloader/workers/shared_records.h"

#include <cstring>

#include "leanloader/core/error.h"

namespace leanloader {

namespace {

constexpr char kMagic[8] = {'L', 'L', 'R', 'E', 'C', 'S', '0', '1'};
constexpr size_t kHeaderBytes = 16;

}  // namespace

SharedRecords::SharedRecords(std::shared_ptr<SharedSegment> segment, size_t count,
                             const uint64_t* offsets, const std::byte* data, size_t data_bytes)
    : segment_(std::move(segment)),
      count_(count),
      offsets_(offsets),
      data_(data),
      data_bytes_(data_bytes) {}

std::shared_ptr<SharedRecords> SharedRecords::pack(const std::vector<std::string_view>& records,
                                                   const std::string& dir) {
  const size_t count = records.size();
  size_t data_bytes = 0;
  for (const std::string_view& r : records) data_bytes += r.size();
  const size_t index_bytes = 8 * (count + 1);
  // At least one byte of data so that an empty list still makes a segment.
  const size_t total = kHeaderBytes + index_bytes + (data_bytes == 0 ? 1 : data_bytes);
  auto segment = SharedSegment::create(total, dir);
  std::byte* base = segment->data();
  std::memcpy(base, kMagic, sizeof(kMagic));
  const uint64_t count64 = count;
  std::memcpy(base + 8, &count64, 8);
  auto* offsets = reinterpret_cast<uint64_t*>(base + kHeaderBytes);
  std::byte* data = base + kHeaderBytes + index_bytes;
  uint64_t offset = 0;
  for (size_t i = 0; i < count; ++i) {
    offsets[i] = offset;
    if (!records[i].empty()) std::memcpy(data + offset, records[i].data(), records[i].size());
    offset += records[i].size();
  }
  offsets[count] = offset;
  return std::shared_ptr<SharedRecords>(
      new SharedRecords(std::move(segment), count, offsets, data, data_bytes));
}

std::shared_ptr<SharedRecords> SharedRecords::attach(std::shared_ptr<SharedSegment> segment) {
  const std::string where = "shared records segment '" + segment->path() + "'";
  const size_t size = segment->size();
  const std::byte* base = segment->data();
  if (size < kHeaderBytes + 8 || std::memcmp(base, kMagic, sizeof(kMagic)) != 0) {
    throw FormatError(where + " does not start with the LLRECS01 header");
  }
  uint64_t count = 0;
  std::memcpy(&count, base + 8, 8);
  if (count > (size - kHeaderBytes) / 8 - 1) {
    throw FormatError(where + " claims " + std::to_string(count) + " records, more than its " +
                      std::to_string(size) + " bytes can index");
  }
  const size_t index_bytes = 8 * (count + 1);
  const auto* offsets = reinterpret_cast<const uint64_t*>(base + kHeaderBytes);
  const size_t data_capacity = size - kHeaderBytes - index_bytes;
  if (offsets[0] != 0) throw FormatError(where + ": the first offset is not 0");
  for (size_t i = 0; i < count; ++i) {
    if (offsets[i + 1] < offsets[i]) {
      throw FormatError(where + ": offset " + std::to_string(i + 1) + " decreases");
    }
  }
  if (offsets[count] > data_capacity) {
    throw FormatError(where + ": records end at " + std::to_string(offsets[count]) +
                      ", past the data area of " + std::to_string(data_capacity) + " bytes");
  }
  const std::byte* data = base + kHeaderBytes + index_bytes;
  const size_t data_bytes = offsets[count];
  return std::shared_ptr<SharedRecords>(
      new SharedRecords(std::move(segment), count, offsets, data, data_bytes));
}

std::span<const std::byte> SharedRecords::record(size_t i) const {
  if (i >= count_) {
    throw InvalidArgument("record index " + std::to_string(i) + " is out of range for " +
                          std::to_string(count_) + " records");
  }
  return {data_ + offsets_[i], static_cast<size_t>(offsets_[i + 1] - offsets_[i])};
}

}  // namespace leanloader
