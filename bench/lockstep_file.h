// The lockstep loops' shared file (bench/train_loop_bench.cc --lockstep): a barrier of the
// ranks of one ceiling, a spin on counters they all map, and, with --average_gradients and
// --split_step, each rank's gradients and parameters placed in the file so that the ranks reduce
// and step their parts of them in place, as the shm plane's ddp does, with no service around.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bench/plain_loop.h"
#include "worker/strategies/gradient_landing.h"

namespace dtrain::bench {

// The --lockstep barrier: one counter per rank, each on its own 64-byte line, in a file every
// process of the ceiling maps. A peer that died or never started fails the wait after a
// minute instead of spinning forever.
class LockstepBarrier {
 public:
  static constexpr int kMaxWorld = 4096 / 64;
  // The counters are shared between processes: only lock-free atomics are plain memory.
  static_assert(std::atomic<uint64_t>::is_always_lock_free);
  // `regions` areas of `exchange` floats per rank follow the counters: --average_gradients'
  // gradients, then with --split_step its parameters and the places backward makes its new
  // gradients in (the job's landing buffers), each area starting on a page of its own as the shm
  // plane's buffers do (no line shared across ranks).
  static absl::StatusOr<std::unique_ptr<LockstepBarrier>> Open(const std::string& path, int rank,
                                                               int world, int64_t exchange,
                                                               int regions);
  ~LockstepBarrier();

  // Rank `r`'s gradients: `exchange()` floats.
  float* Gradients(int r) const {
    return reinterpret_cast<float*>(reinterpret_cast<char*>(counts_) + 4096 + r * stride_);
  }
  // Rank `r`'s parameters (--split_step): `exchange()` floats.
  float* Parameters(int r) const {
    return reinterpret_cast<float*>(reinterpret_cast<char*>(Gradients(r)) + region_);
  }
  // Rank `r`'s landing places (--split_step): `exchange()` floats.
  float* Landing(int r) const {
    return reinterpret_cast<float*>(reinterpret_cast<char*>(Gradients(r)) + 2 * region_);
  }
  int64_t exchange() const { return exchange_; }

  absl::Status ArriveAndWait();

 private:
  LockstepBarrier(std::atomic<uint64_t>* counts, int rank, int world, int64_t exchange,
                  size_t region, size_t stride)
      : counts_(counts),
        rank_(rank),
        world_(world),
        exchange_(exchange),
        region_(region),
        stride_(stride) {}
  std::atomic<uint64_t>* counts_;
  int rank_, world_;
  int64_t exchange_;
  size_t region_;  // bytes from a rank's gradients to its parameters
  size_t stride_;  // bytes from one rank's gradients to the next's (the mapping: 4096 + world's)
  uint64_t arrivals_ = 0;
};

// Each of `parameters`' part of `at` (its length in floats: their elements together), as a
// tensor, and the parameter's gradient pointed there. The averaging reads them as flat float
// arrays.
absl::StatusOr<std::vector<torch::Tensor>> PlaceGradients(
    const std::vector<torch::Tensor>& parameters, float* at);

// Backward leaves new gradients (zero_grad set them to none): copies each into its place in the
// shared file and points the parameter's gradient there again, as a ddp bucket takes them.
void GradientsToPlaces(const std::vector<torch::Tensor>& parameters,
                       const std::vector<torch::Tensor>& places);

// --split_step: the landing places of `parameters` (their elements together, in order) at `at`,
// the file's third region of this rank.
std::unique_ptr<GradientLanding> MakeLanding(const std::vector<torch::Tensor>& parameters,
                                             float* at);

// After a backward in `landing`'s scope: copies each gradient that was not made in its place into
// it, as a job's bucket does (GradientLanding::PlaceGradient; FAILED_PRECONDITION if a place is
// still held by a tensor: the loops keep none); then points each gradient at its part of the
// file's gradients, `places`, where the mean lands.
absl::Status GradientsLanded(GradientLanding& landing, const std::vector<torch::Tensor>& parameters,
                             const std::vector<torch::Tensor>& places);

// --split_step: moves each of `parameters` into its part of `at` (their elements together, in
// order), with its values, so that the other ranks can write the new values there.
void PlaceParameters(const std::vector<torch::Tensor>& parameters, float* at);

// --split_step: an optimizer of `loop`'s kind over elements [begin, end) of the parameters laid
// out at `values` (their gradients at `gradients`), as one tensor: the loop has one param group
// and starts its state fresh, so ddp's split step steps such a range as one tensor too
// (SplitOptimizerStep's runs).
absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> PartOptimizer(const PlainLoop& loop,
                                                                       float* values,
                                                                       float* gradients,
                                                                       int64_t begin, int64_t end);

// Rank `rank`'s part (about 1/world) of the mean of every rank's gradients (`lockstep`'s), written
// into every rank's: the shm plane's in-place all_reduce of a ddp bucket, between its two barriers.
// `from_landing`: every rank's gradients are read from its landing places instead. `own_only`:
// into this rank's alone, as ddp's split step does between the steps of a call (nothing reads
// the other parts there).
void ReduceOwnPart(const LockstepBarrier& lockstep, int rank, int world, bool from_landing,
                   bool own_only);

}  // namespace dtrain::bench
