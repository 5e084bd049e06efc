// RankShard: which positions of an epoch's global order one rank visits.
//
// The global order of an epoch is the Sampler's order (a function of seed and
// epoch only), cut into global batches of `batch_size` consecutive positions.
// Rank r of W takes global batches r, r + W, r + 2W, ...: global batch k is
// the same samples whatever the world size, and the ranks never communicate.
//
// A run may start at a global sample position `start` (a resumed epoch): its
// global batches are then cut from `start` on. Let R = size - start be the
// samples left and nb = ceil(R / batch_size) the global batches left.
//  - drop_last=false: the batch count is padded up to a multiple of W with
//    whole batches that wrap around to the start of the epoch's order (as
//    torch's DistributedSampler pads), so every rank gets ceil(nb / W)
//    batches. Only the last real global batch may be short. Every sample is
//    visited once; the padding repeats (at most W - 1 batches of) samples.
//  - drop_last=true: only full global batches are used, trimmed to a
//    multiple of W: every rank gets floor(floor(R / batch_size) / W) batches
//    and no sample is visited twice; the tail is left out.
// With W = 1 and start = 0 this is exactly the single-process order.
//
// Everything is O(1) time and memory per call.
#pragma once

#include <cstdint>

namespace leanloader {

class RankShard {
 public:
  // Throws InvalidArgument unless batch_size >= 1, world_size >= 1,
  // rank < world_size and start <= size, or when the padded positions do
  // not fit in 64 bits.
  RankShard(uint64_t size, uint64_t batch_size, bool drop_last, uint64_t rank, uint64_t world_size,
            uint64_t start = 0);

  uint64_t size() const noexcept { return size_; }
  uint64_t batch_size() const noexcept { return batch_size_; }
  uint64_t rank() const noexcept { return rank_; }
  uint64_t world_size() const noexcept { return world_size_; }
  uint64_t start() const noexcept { return start_; }

  // Batches this rank delivers in the run (the same on every rank).
  uint64_t num_batches() const noexcept { return num_batches_; }
  // Samples this rank visits in the run: full batches except, maybe, the last.
  uint64_t num_positions() const noexcept { return num_positions_; }
  // Global batches of the run, padding included: num_batches() x world_size.
  uint64_t num_global_batches() const noexcept { return num_batches_ * world_size_; }

  // The position in the epoch's global order (in [0, size)) that this rank
  // visits at its local position `local` (< num_positions()).
  uint64_t order_position(uint64_t local) const noexcept;

  // The global sample position reached once every rank has delivered
  // `local_batches` batches (< num_batches()): the next undelivered sample
  // of the global order. At or past num_batches() the epoch is over and this
  // returns size().
  uint64_t global_position_after(uint64_t local_batches) const noexcept;

 private:
  uint64_t size_;
  uint64_t batch_size_;
  uint64_t rank_;
  uint64_t world_size_;
  uint64_t start_;
  uint64_t real_batches_ = 0;  // global batches holding unpadded samples
  uint64_t num_batches_ = 0;
  uint64_t num_positions_ = 0;
};

}  // namespace leanloader
