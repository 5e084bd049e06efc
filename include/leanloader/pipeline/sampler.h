// Sampler: the order in which sample indices are visited in an epoch.
//
// The order is a pure function of (seed, epoch, position): a keyed bijection
// on [0, size) evaluated per position in O(1) memory, never an N-sized array.
// It does not depend on the number of threads, so any thread can compute
// the index at any position, shards can take strided positions, and resuming
// from a position needs nothing but the position.
#pragma once

#include <cstdint>

namespace leanloader {

// A pseudo-random bijection of [0, size), keyed by `key`. A balanced Feistel
// network over the smallest even-bit power of two >= size, with cycle walking
// to stay inside [0, size) (expected < 4 rounds of walking).
//
// Termination: the network is a bijection of its domain D = [0, 2^(2h)),
// D contains [0, size), and a position p < size lies in D. Walking from p
// follows p's cycle in D, which returns to p itself (< size) after at most |D|
// steps, so the walk ends. A position >= size may lie outside D, where the
// walk never comes back below size: it is rejected (InvalidArgument).
class Permutation {
 public:
  Permutation(uint64_t size, uint64_t key);
  uint64_t size() const noexcept { return size_; }
  // The index at `position`. Throws InvalidArgument when position >= size.
  uint64_t operator()(uint64_t position) const;
  // The size of the Feistel domain (2^(2h) >= size), saturated at 2^64 - 1.
  uint64_t domain() const noexcept;

 private:
  uint64_t feistel(uint64_t value) const noexcept;

  uint64_t size_;
  unsigned half_bits_ = 0;
  uint64_t half_mask_ = 0;
  uint64_t round_keys_[6] = {};
};

class Sampler {
 public:
  Sampler(uint64_t size, bool shuffle, uint64_t seed);

  uint64_t size() const noexcept { return size_; }
  bool shuffle() const noexcept { return shuffle_; }
  uint64_t seed() const noexcept { return seed_; }

  // The sample index visited at `position` of `epoch`. Throws
  // InvalidArgument when position >= size.
  uint64_t index_at(uint64_t epoch, uint64_t position) const;

  // The permutation used for `epoch` (only meaningful when shuffling).
  Permutation permutation(uint64_t epoch) const noexcept;

 private:
  uint64_t size_;
  bool shuffle_;
  uint64_t seed_;
};

}  // namespace leanloader
