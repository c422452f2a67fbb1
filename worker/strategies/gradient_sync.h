// DDP's data-parallel glue over a CollectiveBackend: parameters broadcast from one rank so every
// rank starts identical, and gradients averaged across ranks in buckets (parameters packed, in
// reverse order and by dtype, into flat buffers of at most bucket_bytes), never one collective
// per parameter.
//
// Overlap with backward (as torch's c10d::Reducer): after ExpectSync(), an autograd post-hook on
// each parameter's gradient accumulator marks it ready; when a bucket's last gradient is ready,
// its values are copied into the bucket's flat buffer and its all_reduce starts on a
// communication thread while backward computes the gradients of earlier layers. Buckets start
// strictly in index order on every rank, so the collectives match across ranks even when
// gradients become ready in a different order (or not at all: an unused parameter contributes
// zeros when AverageGradients() closes the round). Reverse parameter order makes the first
// bucket the one backward finishes first; it is capped at 1 MiB as in torch so that
// communication starts early. The buckets not started when backward ends (at least the last:
// nothing is left to overlap with) are all-reduced by the caller's thread: a hand-off to the
// communication thread and back would only add wake-ups.
//
// Without overlap (a plane whose all-reduce is CPU work on backward's own cores: shm) there are
// no hooks and no communication thread, and no lower cap on the first bucket: every bucket is
// all-reduced by the caller's thread after backward.
//
// Gradients live in their buckets (torch DDP's gradient_as_bucket_view): each parameter's
// .grad is its slice of the bucket, and the all_reduce's result is the gradient the optimizer
// reads, so no mean is copied out. A step's first backward makes new gradients (the strategy
// sets them to none before it, as Lightning's zero_grad does): each is copied into its slice
// when its bucket starts, and the parameter's .grad is pointed back at the slice there, so the
// new tensor is freed at once (a sparse gradient is made dense on the way). The buckets' memory
// comes from the plane (CollectiveBackend::AllocateForAllReduce): on shm every rank reads its
// peers' gradients in their buckets.
//
// Thread-safety: one caller thread (the one that runs backward); the communication thread, if
// any, is internal.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include <torch/types.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/collectives/collective_backend.h"
#include "worker/strategies/gradient_landing.h"

namespace torch::autograd {
struct Node;
}

namespace dtrain {

// The first bucket (the last parameters, whose gradients come first) is capped lower, so its
// all-reduce starts early, as torch DDP does.
inline constexpr int64_t kDefaultFirstBucketBytes = int64_t{1} << 20;

// Overwrites `tensors` with rank `src`'s values, packed into one broadcast.
absl::Status BroadcastTensors(CollectiveBackend* backend, const std::vector<torch::Tensor>& tensors,
                              int src);

class GradientSync {
 public:
  // `parameters` are taken in order; all ranks must pass the same list (names, shapes, dtypes).
  // `bucket_bytes` caps each bucket (StrategyOptions::bucket_bytes: the spec's bucket_cap_mb).
  // Without `overlap_with_backward` no bucket starts during backward: no hooks, no
  // communication thread, and the first bucket is not capped lower than the rest.
  GradientSync(CollectiveBackend* backend, std::vector<torch::Tensor> parameters,
               int64_t bucket_bytes, bool overlap_with_backward = true);
  ~GradientSync();
  GradientSync(const GradientSync&) = delete;
  GradientSync& operator=(const GradientSync&) = delete;

  // Overwrites every parameter with rank `src`'s values.
  absl::Status BroadcastParameters(int src = 0);

  // Announces that the next backward ends an optimizer step: its buckets are all-reduced as
  // they become ready (with overlap_with_backward). Without it, AverageGradients() does all the
  // work after backward.
  void ExpectSync();

  // Replaces each gradient by its mean over ranks (a missing gradient counts as zeros): starts
  // the buckets not yet started and waits for all of them. Frozen parameters are left alone.
  absl::Status AverageGradients() { return Average(nullptr); }

  // Moves every parameter into plane memory laid out as its bucket (a second buffer per bucket,
  // `bucket_parameters`), so that AverageGradientsAndUpdate can split an update between the
  // ranks. Collective (the plane allocates). False when the plane gave ordinary memory (its ranks
  // could not share it; the parameters are moved all the same). FAILED_PRECONDITION with buckets
  // that start during backward, or a parameter without its gradient in a bucket (frozen or not
  // contiguous).
  // Where the plane shares memory, it also gives each bucket a landing buffer laid out alike, in
  // which backward's new gradients may be made (landing()); a bucket whose every gradient was
  // made there is reduced from there, without its copy into the bucket.
  absl::StatusOr<bool> PlaceParametersBesideBuckets();
  // The landing places, one per parameter with a slot (null without them): backward runs inside
  // a GradientLanding::Scope over it.
  GradientLanding* landing() const { return landing_.get(); }
  // Buckets reduced from their landing buffer, over all rounds (for tests and the log).
  int64_t landed_total() const { return landed_total_; }
  // AverageGradients, then `update(bucket, begin, end)` on the elements [begin, end) of a bucket
  // this rank is to update (CollectiveBackend::AllReduceThenUpdate): it reads the averaged
  // gradients in `bucket_flat(bucket)` and writes the parameters in `bucket_parameters(bucket)`
  // there. Needs PlaceParametersBesideBuckets. Without `gradients_everywhere`, the averaged
  // gradients are right on this rank only where it updated: for a step after which nothing
  // reads the gradients before the next backward replaces them.
  using BucketUpdate = std::function<absl::Status(size_t bucket, int64_t begin, int64_t end)>;
  absl::Status AverageGradientsAndUpdate(const BucketUpdate& update,
                                         bool gradients_everywhere = true);

  // Bucket b's gradients (its all_reduce's buffer), its parameters once placed beside it, and
  // which parameters (indices into the constructor's list) lie there, in order from element 0.
  const torch::Tensor& bucket_flat(size_t b) const { return buckets_[b].flat; }
  const torch::Tensor& bucket_parameters(size_t b) const { return buckets_[b].parameter_flat; }
  const std::vector<size_t>& parameters_in_bucket(size_t b) const { return buckets_[b].parameters; }

  // Returns once every bucket queued so far has been all-reduced. A collective the caller's
  // thread issues afterwards (model code's, during backward) then follows them on every rank:
  // buckets are queued from that same thread, in the same order everywhere.
  void WaitForInFlight();

  // How the parameters were packed: number of buckets (one collective each).
  size_t bucket_count() const { return buckets_.size(); }
  bool overlaps_backward() const { return overlap_; }
  // How many buckets of the last AverageGradients() round were started from the autograd
  // hooks, i.e. while backward was still running (never the last bucket: see above).
  size_t started_during_backward() const;
  // Totals over all rounds, for the worker's log: how long AverageGradients() waited for the
  // collectives after backward (the communication not hidden behind compute).
  int64_t rounds() const { return rounds_; }
  absl::Duration exposed_wait() const { return exposed_wait_; }
  // Of AverageGradientsAndUpdate's time, the updates' (not in exposed_wait).
  absl::Duration update_time() const { return update_time_; }
  int64_t buckets_started_during_backward_total() const { return overlapped_total_; }

 private:
  class ReadyHook;
  struct Bucket {
    std::vector<size_t> parameters;  // indices into parameters_
    torch::Tensor flat;              // the collective's buffer (and the gradients), allocated once
    torch::Tensor parameter_flat;    // PlaceParametersBesideBuckets: the parameters, laid out alike
    // Per parameter: its gradient's place in `flat`, a tensor of its own (undefined for a
    // parameter that has none there: frozen or not contiguous).
    std::vector<torch::Tensor> slots;
    // With landing_: the reduction's input when the bucket landed, laid out as `flat` (shifted in
    // its buffer so that most of its bytes start on 64), and the index in landing_ of its first
    // parameter's place (slot k's is first_place + k).
    torch::Tensor landing_flat;
    size_t first_place = 0;
    size_t pending = 0;  // gradients not yet ready in this round
  };

  absl::Status Average(const BucketUpdate* update, bool gradients_everywhere = true);
  void BeginRound() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MarkReady(size_t parameter);
  // Queues the all_reduce of each startable bucket but the last (copying in the gradients
  // that do not live in it). Only from the hooks: after backward the caller runs the rest.
  void StartReadyBuckets() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Copies into the bucket's memory the gradients that do not live there (zeros for none), and
  // points each trainable parameter's gradient at its slice. With `may_land` (a split step's
  // averaging): true when some gradient of the bucket was made in its landing place and every
  // other one's place is free; those others are copied into their places instead, and the
  // reduction reads the landing buffer.
  bool PackBucket(Bucket& bucket, bool may_land);
  // PlaceParametersBesideBuckets' landing buffers and landing_ (collective; none without shared
  // memory for them).
  absl::Status PlaceLandingBuffers();
  void CommunicationLoop();

  CollectiveBackend* const backend_;
  std::vector<torch::Tensor> parameters_;
  const bool overlap_;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;  // parameter index -> bucket index
  std::vector<std::pair<std::shared_ptr<torch::autograd::Node>, uintptr_t>> hooks_;

  mutable absl::Mutex mu_;
  bool armed_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<bool> ready_ ABSL_GUARDED_BY(mu_);  // per parameter, this round
  // Buckets handed to the communication thread this round, in index order, from the hooks.
  size_t started_ ABSL_GUARDED_BY(mu_) = 0;
  size_t finished_ ABSL_GUARDED_BY(mu_) = 0;  // buckets the thread is done with
  absl::Status round_status_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread communication_;
  int64_t rounds_ = 0;
  int64_t overlapped_total_ = 0;
  absl::Duration exposed_wait_;
  absl::Duration update_time_;
  std::unique_ptr<GradientLanding> landing_;
  int64_t landed_total_ = 0;
};

}  // namespace dtrain
