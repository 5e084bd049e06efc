#include "leanloader/pipeline/shard.h"

#include <algorithm>
#include <string>

#include "leanloader/core/checked_size.h"
#include "leanloader/core/error.h"

namespace leanloader {

RankShard::RankShard(uint64_t size, uint64_t batch_size, bool drop_last, uint64_t rank,
                     uint64_t world_size, uint64_t start)
    : size_(size), batch_size_(batch_size), rank_(rank), world_size_(world_size), start_(start) {
  if (batch_size == 0) throw InvalidArgument("batch_size must be at least 1");
  if (world_size == 0) throw InvalidArgument("world_size must be at least 1");
  if (rank >= world_size) {
    throw InvalidArgument("rank " + std::to_string(rank) + " is outside world_size " +
                          std::to_string(world_size) + " (ranks are 0 .. world_size - 1)");
  }
  if (start > size) {
    throw InvalidArgument("start position " + std::to_string(start) + " is past the " +
                          std::to_string(size) + " samples of the source");
  }
  const uint64_t remaining = size - start;
  if (drop_last) {
    real_batches_ = remaining / batch_size;
    num_batches_ = real_batches_ / world_size;
  } else {
    real_batches_ = remaining / batch_size + (remaining % batch_size != 0 ? 1 : 0);
    num_batches_ = real_batches_ / world_size + (real_batches_ % world_size != 0 ? 1 : 0);
  }
  // Every global position of the run, padding included, must be computable.
  const auto global_batches = checked_mul(num_batches_, world_size);
  const auto global_positions =
      global_batches ? checked_mul(*global_batches, batch_size) : std::nullopt;
  if (!global_positions || !checked_add(*global_positions, start)) {
    throw InvalidArgument("batch_size " + std::to_string(batch_size) + " x world_size " +
                          std::to_string(world_size) + " over " + std::to_string(size) +
                          " samples overflows 64-bit positions");
  }
  if (num_batches_ > 0) {
    const uint64_t last = (num_batches_ - 1) * world_size + rank;  // this rank's last global batch
    const uint64_t last_rows =
        last < real_batches_ ? std::min(batch_size, remaining - last * batch_size) : batch_size;
    num_positions_ = (num_batches_ - 1) * batch_size + last_rows;
  }
}

uint64_t RankShard::order_position(uint64_t local) const noexcept {
  const uint64_t global_batch = (local / batch_size_) * world_size_ + rank_;
  const uint64_t row = local % batch_size_;
  if (global_batch < real_batches_) return start_ + global_batch * batch_size_ + row;
  // Padding: whole batches wrapping around to the start of the epoch's order.
  return ((global_batch - real_batches_) * batch_size_ + row) % size_;
}

uint64_t RankShard::global_position_after(uint64_t local_batches) const noexcept {
  if (local_batches >= num_batches_) return size_;
  return std::min(size_, start_ + local_batches * world_size_ * batch_size_);
}

}  // namespace leanloader
