// Batch: what the consumer receives, and the record of a skipped sample.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "leanloader/core/tensor.h"
#include "leanloader/core/warning.h"

namespace leanloader {

struct Batch {
  int64_t batch_index = 0;
  std::vector<int64_t> indices;             // sample indices, skipped ones removed
  std::vector<Tensor> stacked;              // collate=stack: per field
  std::vector<std::vector<Tensor>> listed;  // collate=list: per field, per sample
  std::vector<Warning> warnings;            // surface once to the user
};

// A summary of one skipped sample.
struct SkippedSample {
  int64_t sample_index;
  std::string message;
};

}  // namespace leanloader
