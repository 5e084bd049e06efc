#include "leanloader/pipeline/sampler.h"

#include <gtest/gtest.h>

#include <vector>

#include "leanloader/core/error.h"

namespace leanloader {
namespace {

// Every position maps to a distinct index below size: a bijection.
void expect_bijection(uint64_t size, uint64_t key) {
  const Permutation permutation(size, key);
  std::vector<bool> seen(size, false);
  for (uint64_t position = 0; position < size; ++position) {
    const uint64_t index = permutation(position);
    ASSERT_LT(index, size) << "size " << size << " position " << position;
    ASSERT_FALSE(seen[index]) << "index " << index << " visited twice, size " << size;
    seen[index] = true;
  }
}

TEST(SamplerTest, PermutationIsABijectionForSmallAndPrimeSizes) {
  for (const uint64_t size : {1ULL, 2ULL, 3ULL, 4ULL, 5ULL, 7ULL, 64ULL, 1000ULL, 65537ULL}) {
    for (uint64_t key = 0; key < 4; ++key) expect_bijection(size, key);
  }
}

TEST(SamplerTest, PermutationIsABijectionForTenMillion) {
  // The permutation itself holds a few words; only the check allocates.
  expect_bijection(10'000'000, 42);
  EXPECT_LT(sizeof(Permutation), 128u);
}

TEST(SamplerTest, SequentialWithoutShuffle) {
  const Sampler sampler(10, false, 7);
  for (uint64_t p = 0; p < 10; ++p) EXPECT_EQ(sampler.index_at(3, p), p);
}

TEST(SamplerTest, OrderDependsOnSeedAndEpochOnly) {
  const Sampler a(1000, true, 1);
  const Sampler b(1000, true, 1);
  const Sampler other_seed(1000, true, 2);
  bool epoch_differs = false, seed_differs = false;
  for (uint64_t p = 0; p < 1000; ++p) {
    EXPECT_EQ(a.index_at(5, p), b.index_at(5, p));
    epoch_differs |= a.index_at(5, p) != a.index_at(6, p);
    seed_differs |= a.index_at(5, p) != other_seed.index_at(5, p);
  }
  EXPECT_TRUE(epoch_differs);
  EXPECT_TRUE(seed_differs);
}

TEST(SamplerTest, ShuffleIsNotTheIdentity) {
  const Sampler sampler(100, true, 0);
  int fixed_points = 0;
  for (uint64_t p = 0; p < 100; ++p) fixed_points += sampler.index_at(0, p) == p;
  EXPECT_LT(fixed_points, 10);
}

TEST(SamplerTest, PositionOutsideTheEpochIsAnError) {
  // A position past the size used to walk forever when it also lay past the
  // Feistel domain (a sampler sized for an older, smaller source).
  for (const uint64_t size : {0ULL, 1ULL, 5ULL, 100ULL, 1000ULL}) {
    const Permutation permutation(size, 3);
    EXPECT_THROW(permutation(size), InvalidArgument) << size;
    EXPECT_THROW(permutation(permutation.domain()), InvalidArgument) << size;
    EXPECT_THROW(permutation(~uint64_t{0}), InvalidArgument) << size;
    for (const bool shuffle : {false, true}) {
      const Sampler sampler(size, shuffle, 1);
      EXPECT_THROW(sampler.index_at(0, size), InvalidArgument) << size;
    }
  }
  try {
    Permutation(100, 0)(250);
    FAIL() << "no error";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("position 250"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("100 samples"), std::string::npos) << error.what();
  }
}

TEST(SamplerTest, DomainCoversTheSizeSoEveryWalkEnds) {
  // The termination argument needs size <= domain (every position below the
  // size lies in the Feistel domain): check it at every power-of-two edge.
  for (unsigned bits = 0; bits < 64; ++bits) {
    const uint64_t edge = uint64_t{1} << bits;
    for (const uint64_t size : {edge - 1, edge, edge + 1}) {
      if (size == 0) continue;
      const Permutation permutation(size, bits);
      EXPECT_GE(permutation.domain(), size) << size;
      EXPECT_LT(permutation(size - 1), size) << size;
      EXPECT_LT(permutation(0), size) << size;
    }
  }
  const Permutation largest(~uint64_t{0}, 1);
  EXPECT_LT(largest(~uint64_t{0} - 1), ~uint64_t{0});
}

}  // namespace
}  // namespace leanloader
