// Content hashes for cache fingerprints: XXH64 (xxHash, 64-bit), implemented
// here so that the core needs no extra dependency.
//
// XXH64 is not cryptographic: it detects edits of a source file, not an
// adversary who crafts collisions. Output is byte-for-byte the reference
// algorithm (github.com/Cyan4973/xxHash), so hashes can be checked with the
// `xxhsum -H1` tool.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace leanloader {

// Incremental XXH64. Not thread-safe; one hasher per stream.
class Xxh64 {
 public:
  explicit Xxh64(uint64_t seed = 0) noexcept;
  void update(std::span<const std::byte> bytes) noexcept;
  uint64_t digest() const noexcept;

 private:
  uint64_t seed_;
  uint64_t lanes_[4];
  uint64_t total_ = 0;
  std::byte buffer_[32];
  size_t buffered_ = 0;
};

uint64_t xxh64(std::span<const std::byte> bytes, uint64_t seed = 0) noexcept;

// "xxh64:<16 lowercase hex digits>", the text form of a hash.
std::string xxh64_text(uint64_t hash);

// "xxh64:<16 lowercase hex digits>" of the whole file, read with pread in
// large chunks (no mapping: hashing a source must not pin its pages). Throws
// IoError naming the path.
std::string content_hash_file(const std::string& path);

}  // namespace leanloader
