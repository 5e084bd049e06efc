#include "leanloader/pipeline/sampler.h"

#include <string>

#include "leanloader/core/error.h"

namespace leanloader {

namespace {

// splitmix64 finaliser: a fast, well-mixed 64-bit hash.
constexpr uint64_t mix64(uint64_t x) noexcept {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

Permutation::Permutation(uint64_t size, uint64_t key) : size_(size) {
  unsigned bits = 0;
  while (bits < 64 && (uint64_t{1} << bits) < size) ++bits;
  half_bits_ = (bits + 1) / 2;
  if (half_bits_ == 0) half_bits_ = 1;
  half_mask_ = (uint64_t{1} << half_bits_) - 1;
  uint64_t state = mix64(key);
  for (uint64_t& round_key : round_keys_) {
    state = mix64(state + 0x632be59bd9b4e019ULL);
    round_key = state;
  }
}

uint64_t Permutation::feistel(uint64_t value) const noexcept {
  uint64_t left = value >> half_bits_;
  uint64_t right = value & half_mask_;
  for (const uint64_t round_key : round_keys_) {
    const uint64_t next = left ^ (mix64(right ^ round_key) & half_mask_);
    left = right;
    right = next;
  }
  return (left << half_bits_) | right;
}

uint64_t Permutation::domain() const noexcept {
  return 2 * half_bits_ >= 64 ? ~uint64_t{0} : uint64_t{1} << (2 * half_bits_);
}

namespace {

[[noreturn]] void position_out_of_range(uint64_t position, uint64_t size) {
  throw InvalidArgument("sampler position " + std::to_string(position) +
                        " is outside the epoch of " + std::to_string(size) + " samples");
}

}  // namespace

uint64_t Permutation::operator()(uint64_t position) const {
  if (position >= size_) position_out_of_range(position, size_);
  if (size_ == 1) return 0;
  // Cycle walking: the Feistel network permutes [0, 2^(2*half_bits)); values
  // that land outside [0, size) are walked along their cycle until they land
  // inside, which restricts the bijection to [0, size).
  uint64_t value = feistel(position);
  while (value >= size_) value = feistel(value);
  return value;
}

Sampler::Sampler(uint64_t size, bool shuffle, uint64_t seed)
    : size_(size), shuffle_(shuffle), seed_(seed) {}

Permutation Sampler::permutation(uint64_t epoch) const noexcept {
  return Permutation(size_, mix64(seed_) ^ mix64(epoch * 0x9e3779b97f4a7c15ULL + 1));
}

uint64_t Sampler::index_at(uint64_t epoch, uint64_t position) const {
  if (!shuffle_) {
    if (position >= size_) position_out_of_range(position, size_);
    return position;
  }
  return permutation(epoch)(position);
}

}  // namespace leanloader
