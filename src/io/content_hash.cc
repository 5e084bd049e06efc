#include "leanloader/io/content_hash.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "io/file_io.h"
#include "leanloader/core/error.h"

namespace leanloader {

namespace {

constexpr uint64_t kPrime1 = 0x9E3779B185EBCA87ULL;
constexpr uint64_t kPrime2 = 0xC2B2AE3D27D4EB4FULL;
constexpr uint64_t kPrime3 = 0x165667B19E3779F9ULL;
constexpr uint64_t kPrime4 = 0x85EBCA77C2B2AE63ULL;
constexpr uint64_t kPrime5 = 0x27D4EB2F165667C5ULL;

constexpr uint64_t rotl(uint64_t x, int r) noexcept { return (x << r) | (x >> (64 - r)); }

// Little-endian loads regardless of the host's alignment rules.
uint64_t load64(const std::byte* p) noexcept {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint64_t>(p[i]);
  return v;
}
uint32_t load32(const std::byte* p) noexcept {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint32_t>(p[i]);
  return v;
}

uint64_t round(uint64_t acc, uint64_t input) noexcept {
  acc += input * kPrime2;
  acc = rotl(acc, 31);
  return acc * kPrime1;
}

uint64_t merge_round(uint64_t acc, uint64_t value) noexcept {
  acc ^= round(0, value);
  return acc * kPrime1 + kPrime4;
}

}  // namespace

Xxh64::Xxh64(uint64_t seed) noexcept : seed_(seed) {
  lanes_[0] = seed + kPrime1 + kPrime2;
  lanes_[1] = seed + kPrime2;
  lanes_[2] = seed;
  lanes_[3] = seed - kPrime1;
}

void Xxh64::update(std::span<const std::byte> bytes) noexcept {
  const std::byte* p = bytes.data();
  size_t size = bytes.size();
  total_ += size;
  if (buffered_ + size < 32) {
    if (size > 0) std::memcpy(buffer_ + buffered_, p, size);
    buffered_ += size;
    return;
  }
  if (buffered_ > 0) {
    const size_t fill = 32 - buffered_;
    std::memcpy(buffer_ + buffered_, p, fill);
    for (int i = 0; i < 4; ++i) lanes_[i] = round(lanes_[i], load64(buffer_ + 8 * i));
    p += fill;
    size -= fill;
    buffered_ = 0;
  }
  while (size >= 32) {
    for (int i = 0; i < 4; ++i) lanes_[i] = round(lanes_[i], load64(p + 8 * i));
    p += 32;
    size -= 32;
  }
  if (size > 0) std::memcpy(buffer_, p, size);
  buffered_ = size;
}

uint64_t Xxh64::digest() const noexcept {
  uint64_t h;
  if (total_ >= 32) {
    h = rotl(lanes_[0], 1) + rotl(lanes_[1], 7) + rotl(lanes_[2], 12) + rotl(lanes_[3], 18);
    for (int i = 0; i < 4; ++i) h = merge_round(h, lanes_[i]);
  } else {
    h = seed_ + kPrime5;
  }
  h += total_;
  const std::byte* p = buffer_;
  size_t size = buffered_;
  while (size >= 8) {
    h ^= round(0, load64(p));
    h = rotl(h, 27) * kPrime1 + kPrime4;
    p += 8;
    size -= 8;
  }
  if (size >= 4) {
    h ^= static_cast<uint64_t>(load32(p)) * kPrime1;
    h = rotl(h, 23) * kPrime2 + kPrime3;
    p += 4;
    size -= 4;
  }
  while (size > 0) {
    h ^= static_cast<uint64_t>(*p) * kPrime5;
    h = rotl(h, 11) * kPrime1;
    ++p;
    --size;
  }
  h ^= h >> 33;
  h *= kPrime2;
  h ^= h >> 29;
  h *= kPrime3;
  h ^= h >> 32;
  return h;
}

uint64_t xxh64(std::span<const std::byte> bytes, uint64_t seed) noexcept {
  Xxh64 hasher(seed);
  hasher.update(bytes);
  return hasher.digest();
}

std::string content_hash_file(const std::string& path) {
  const detail::File file(path);
  Xxh64 hasher;
  std::vector<std::byte> chunk(std::min<size_t>(file.size(), size_t{4} << 20));
  for (size_t offset = 0; offset < file.size();) {
    const size_t n = std::min(chunk.size(), file.size() - offset);
    file.read_exact(offset, {chunk.data(), n});
    hasher.update(std::span(chunk.data(), n));
    offset += n;
  }
  return xxh64_text(hasher.digest());
}

std::string xxh64_text(uint64_t hash) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "xxh64:";
  for (int shift = 60; shift >= 0; shift -= 4) out.push_back(kHex[(hash >> shift) & 0xF]);
  return out;
}

}  // namespace leanloader
