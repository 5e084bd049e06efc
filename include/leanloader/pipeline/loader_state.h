// LoaderState: where a Loader stands in its epochs, in O(1) space.
//
// The order of an epoch depends on (seed, epoch) only, so a position in it is
// enough to resume: the state holds the epoch and the number of samples of
// its global order consumed by all ranks together, plus what must match for
// that position to mean the same samples (the source's fingerprint and size,
// the seed, shuffling). Its size does not depend on the dataset's size, and
// restoring it is a handful of arithmetic operations.
#pragma once

#include <cstdint>
#include <string>

#include "leanloader/sources/source.h"

namespace leanloader {

struct LoaderState {
  static constexpr int kVersion = 1;
  int version = kVersion;
  uint64_t epoch = 0;     // the epoch to continue
  uint64_t position = 0;  // samples of that epoch's global order consumed by all ranks
  uint64_t seed = 0;
  bool shuffle = false;
  int64_t batch_size = 1;
  bool drop_last = false;
  uint64_t world_size = 1;  // of the run that saved it (informative: resuming may change it)
  uint64_t size = 0;        // samples in the source
  std::string fingerprint;  // source_fingerprint() of the source
};

// A cheap identity of a source: "xxh64:<hex>" of its sample count, its field
// specs (name, dtype, shape) and describe() (which names its files). Reads no
// sample data; equal for the same files opened in another process.
std::string source_fingerprint(const Source& source);

}  // namespace leanloader
