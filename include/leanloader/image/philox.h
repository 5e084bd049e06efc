// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2,
// 3", SC'11): a counter-based generator. The output is a pure function of
// (counter, key), so random transforms keyed by (seed, epoch, sample index)
// give the same draws whatever thread reads the sample and in whatever order.
#pragma once

#include <array>
#include <cstdint>

namespace leanloader {

using PhiloxCounter = std::array<uint32_t, 4>;
using PhiloxKey = std::array<uint32_t, 2>;

// One Philox4x32 block with 10 rounds (Random123's philox4x32_10).
constexpr PhiloxCounter philox4x32_10(PhiloxCounter counter, PhiloxKey key) noexcept {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key[0] += kW0;
      key[1] += kW1;
    }
    const uint64_t p0 = uint64_t{kM0} * counter[0];
    const uint64_t p1 = uint64_t{kM1} * counter[2];
    counter = {static_cast<uint32_t>(p1 >> 32) ^ counter[1] ^ key[0], static_cast<uint32_t>(p1),
               static_cast<uint32_t>(p0 >> 32) ^ counter[3] ^ key[1], static_cast<uint32_t>(p0)};
  }
  return counter;
}

// The draws of one sample: key = seed, counter = (block, epoch, index). Each
// block gives four 32-bit words; blocks follow one another, so a sample can
// draw as much as it needs. The counter holds the epoch's low 32 bits; its
// high ones are folded into the key (XOR: zero for epochs below 2^32, whose
// streams stay as they were), so that epoch e and e + 2^32 of one seed draw
// differently. Not thread-safe (one stream per sample read).
class SampleRandom {
 public:
  SampleRandom(uint64_t seed, uint64_t epoch, uint64_t index) noexcept
      : key_{static_cast<uint32_t>(seed) ^ static_cast<uint32_t>(epoch >> 32),
             static_cast<uint32_t>(seed >> 32)},
        epoch_(static_cast<uint32_t>(epoch)),
        index_(index) {}

  uint32_t next_u32() noexcept {
    if (used_ == 4) {
      block_words_ = philox4x32_10(
          {block_++, epoch_, static_cast<uint32_t>(index_), static_cast<uint32_t>(index_ >> 32)},
          key_);
      used_ = 0;
    }
    return block_words_[used_++];
  }

  // A double uniform in [0, 1) with 53 random bits.
  double uniform() noexcept {
    const uint64_t high = next_u32();
    const uint64_t bits = ((high << 32) | next_u32()) >> 11;
    return static_cast<double>(bits) * 0x1.0p-53;
  }

  // A double uniform in [low, high).
  double uniform(double low, double high) noexcept { return low + (high - low) * uniform(); }

  // An integer uniform in [0, bound) (bound > 0), as floor(uniform() * bound).
  int64_t below(int64_t bound) noexcept {
    const auto value = static_cast<int64_t>(uniform() * static_cast<double>(bound));
    return value < bound ? value : bound - 1;
  }

 private:
  PhiloxKey key_;
  uint32_t epoch_;
  uint64_t index_;
  uint32_t block_ = 0;
  PhiloxCounter block_words_{};
  int used_ = 4;
};

}  // namespace leanloader
