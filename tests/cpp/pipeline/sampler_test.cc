#include "leanloader/pipeline/sampler.h"

#include <gtest/gtest.h>

#include <vector>

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

}  // namespace
}  // namespace leanloader
