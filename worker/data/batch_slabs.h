// The batches a streamed split's samples are decoded into (ShardedSplit). Each batch of the
// running epoch has a "slab": one tensor per field, whose row i whichever thread decodes the
// batch's sample i writes in place, so the step gets the batch without a copy or a collation.
// Batches handed to the step come back to a pool and are reused for a later slab once nobody
// holds them any more: a fresh 38 MB batch (64 x 3x224x224 floats) is an mmap whose page faults
// cost more than writing it.
//
// Thread-safety: Reset, Of, Finish and Clear under the caller's lock (ShardedSplit's mu_, in the
// trip that hands a sample out, so finding its slab costs no trip of its own); Row and Lend from
// any thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include <ATen/core/Tensor.h>

namespace dtrain {

class BatchSlabs {
 public:
  // One batch's tensors as the decoding threads write them: row i is position first + i.
  struct Slab {
    int64_t first = 0;
    int64_t rows = 0;
    std::mutex mu;
    std::vector<at::Tensor> columns;  // per field; made by the first sample that writes it
  };

  // Batches of `batch` positions from `base` (the position the stream starts at) up to
  // `end`, the epoch's end; the slabs of an earlier stream are forgotten.
  void Reset(int64_t base, int64_t batch, int64_t end);
  void Clear() { slabs_.clear(); }
  // The slab `position` is written into; null before base or at or after end.
  std::shared_ptr<Slab> Of(int64_t position);
  // The step took positions first..last: the slabs that end by then are let go, and the one
  // that is exactly that batch (null if none) is returned.
  std::shared_ptr<Slab> Finish(int64_t first, int64_t last);

  // Where field `field` of the slab's row `row` goes when it is of `sizes` and `type`: the
  // column is made (or taken from the pool) by the first row that writes it. Undefined when
  // the column is of another shape or type (a batch whose samples differ is collated by copy).
  at::Tensor Row(Slab& slab, int64_t row, size_t field, at::IntArrayRef sizes, at::ScalarType type);
  // A slab's columns handed to the step as its batch: kept for reuse (a few batches' worth;
  // the step holds one or two at a time).
  void Lend(const std::vector<at::Tensor>& columns);

 private:
  at::Tensor Buffer(std::vector<int64_t> sizes, at::ScalarType type);

  int64_t base_ = 0;
  int64_t batch_ = 1;
  int64_t end_ = 0;
  std::map<int64_t, std::shared_ptr<Slab>> slabs_;  // by batch number
  std::mutex pool_mu_;
  std::vector<at::Tensor> pool_;  // guarded by pool_mu_
};

}  // namespace dtrain
