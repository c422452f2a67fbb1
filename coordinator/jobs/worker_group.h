// WorkerGroup: the workers of one run of a job, as the trainer's loops see them: set up the job
// on every rank, train on these batches of sample indices, evaluate, predict, save and load
// checkpoints, agree on a decision, tear down. The loops speak only this interface, in domain
// types (no protos, no stubs), so a loop's behaviour is tested in-process against a fake
// (coordinator/jobs/testing/fake_worker_group.h) and runs in production over gRPC
// (grpc_worker_group.h), as Lightning's loops run on a Strategy.
//
// Batches are addressed by global rank: `batches[rank][b]` is rank `rank`'s b-th batch of sample
// indices. An implementation maps ranks onto its workers.
//
// Errors, for every call: UNAVAILABLE when a worker was lost (stopped, died, unreachable, or
// marked lost by the registry), naming it; CANCELLED after Cancel; otherwise the failing
// worker's own status (INVALID_ARGUMENT, FAILED_PRECONDITION, ABORTED for a failed group,
// DEADLINE_EXCEEDED), naming the worker and its ranks.
//
// Thread-safety: one thread (the job's) makes the calls; Cancel and MarkLost may come from any.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/setup_request.h"
#include "common/tensor.h"
#include "dtrain/v1/jobs.pb.h"
#include "dtrain/v1/worker.pb.h"

namespace dtrain {

// [rank][batch] -> sample indices.
using RankBatches = std::vector<std::vector<std::vector<int64_t>>>;

// What the group reports once every rank is set up.
struct GroupSetup {
  int world_size = 1;
  // The dataset's splits (train, val, test, predict) by name, as rank 0 loaded them.
  std::map<std::string, int64_t> split_sizes;
  // The splits streamed from shards (data.shards): addressed by position in a rank's epoch.
  std::set<std::string> streamed_splits;
  // The collectives' data plane the ranks chose together ("" for one-process strategies), and
  // why some worker's plane is not the one asked for ("w1: gloo cannot connect; ...").
  std::string collective_plane;
  std::string plane_notes;
  absl::Duration group_formation;
  // For the job log: each worker with its ranks ("worker 'w1' (rank 1)"), and each rank's place
  // by rank ("rank 0 on 'w1' (node 0, local 0, cpus 0-1)").
  std::vector<std::string> workers;
  std::vector<std::string> ranks;
  // The model's recorded hyperparameters, name and YAML flow text, in their order.
  std::vector<std::pair<std::string, std::string>> hyper_parameters;
  // What the job trains with (SetupResponse.optimization) and configure_optimizers'
  // ReduceLROnPlateau monitors (name, strict).
  std::string optimization;
  std::vector<std::pair<std::string, bool>> plateau_monitors;
  // Every worker takes a training call's batches as their sampler's description
  // (LocalWork.sampled) and answers packed results: the loop need not list them.
  bool sampled_work = false;
  // When not: each worker whose SetupResponse.sampler_deal is not the coordinator's, with its
  // deal ("worker 'w1' deals no batches (an older build)"), for the job's log. Empty for a
  // group that never deals (the loops' fake).
  std::vector<std::string> other_deals;
};

// One batch's outcome: its samples and the scalars its step returned (loss, ...).
// A value model code logged (self.log) during a batch, with Lightning's options resolved by the
// worker for the stage.
struct LoggedValue {
  double value = 0;        // the step's value (reduced over the ranks when sync_dist)
  double local_value = 0;  // the rank's own value, for epoch aggregates
  bool on_step = false;
  bool on_epoch = false;
  std::string reduce_fx = "mean";  // mean, sum, max, min
  double weight = 1;               // the batch_size a mean weighs it by
  bool prog_bar = false;
};

struct BatchScalars {
  int64_t size = 0;
  std::map<std::string, double> scalars;
  std::map<std::string, LoggedValue> logged;  // by the name the model gave
  bool optimizer_stepped = false;             // training: the batch ended a step
  // Training, on a batch that ended a step: the step's learning rates by LearningRateMonitor's
  // names (lr-AdamW, lr-AdamW/pg1, ...).
  std::map<std::string, double> learning_rates;
};

// How every rank's training batches are dealt (common/distributed_sampler.h), for workers
// that deal them themselves (LocalWork.sampled).
struct TrainSampling {
  int64_t samples = 0;  // the train split's size after data.limit_train_samples
  bool shuffle = false;
  uint64_t seed = 0;
  int64_t batch_size = 1;
};

// One training call: batches [first, first + count) of every rank's epoch.
struct TrainCall {
  int64_t epoch = 0;
  // The batches listed; null when GroupSetup.sampled_work lets `sampling` name them.
  const RankBatches* batches = nullptr;
  TrainSampling sampling;
  int64_t first = 0;
  int64_t count = 0;
  // The call's last batch ends the epoch (it closes the accumulation window).
  bool end_of_epoch = false;
  int64_t total_steps = 0;  // the run's optimizer steps, for schedules of the run's length
  // ReduceLROnPlateau's monitored values at the last epoch's end (StepRequest.monitored).
  std::map<std::string, double> monitored;
};

// Of a call's step time, each phase's, in seconds (LocalResult.phases; docs/jobs.md).
struct StepPhaseSeconds {
  double data = 0;
  double forward = 0;
  double backward = 0;
  double averaging = 0;
  double optimizer = 0;

  double total() const { return data + forward + backward + averaging + optimizer; }
  StepPhaseSeconds& operator+=(const StepPhaseSeconds& other) {
    data += other.data;
    forward += other.forward;
    backward += other.backward;
    averaging += other.averaging;
    optimizer += other.optimizer;
    return *this;
  }
};

struct RankTrainResult {
  int rank = 0;
  int64_t global_step = 0;
  double step_seconds = 0;           // in the call's batches
  double gradient_wait_seconds = 0;  // of which waiting for the other ranks' gradients
  double data_wait_seconds = 0;      // of which waiting for streamed samples (input-bound)
  int64_t data_skipped = 0;          // streamed samples skipped so far (on_error: skip)
  StepPhaseSeconds phases;           // all zero from a worker that does not report them
  // Of step_seconds, runnable while other work held the step thread's core; none from a
  // worker whose kernel keeps no scheduler statistics (or that is older).
  std::optional<double> core_wait_seconds;
  std::vector<BatchScalars> batches;
};
struct TrainResult {
  std::vector<RankTrainResult> ranks;  // each rank that answered, in rank order
};

// kSanity: validation steps as Lightning's sanity check (StepRequest.sanity_check).
enum class EvalKind { kValidation, kTest, kSanity };

// Per rank, per batch.
struct EvalResult {
  std::vector<std::vector<BatchScalars>> ranks;
};

// Batches [first, first + count) of every rank's `batches`; outputs come back by name.
struct PredictCall {
  std::string split;  // predict, or test when the data has no predict split
  const RankBatches* batches = nullptr;
  int64_t first = 0;
  int64_t count = 0;
};
// One predict batch's outputs. With data.shards.on_error: skip a batch can lose samples: `kept`
// then holds the offsets, in the batch's indices, of the rows the outputs hold (empty: every
// row; a batch that lost every sample has no outputs).
struct PredictedBatch {
  std::map<std::string, HostTensor> outputs;
  std::vector<int64_t> kept;
  std::string output_type;  // BatchResult.output_type: tensor, dict, list or tuple
};
struct PredictResult {
  std::vector<std::vector<PredictedBatch>> ranks;  // [rank][batch]
};

struct SaveCall {
  std::string name;  // a file name in the job's checkpoint directory
  int64_t epoch = 0;
  std::vector<std::string> remove;           // older checkpoints to delete once it is written
  std::string spec_json;                     // kept in the checkpoint's metadata
  int64_t total_steps = 0;                   // the run's optimizer steps, as TrainCall's
  std::map<std::string, double> monitored;   // as TrainCall's, at an epoch's end
  std::vector<v1::CallbackState> callbacks;  // the callbacks' states, in the file
};
struct SavedCheckpoint {
  bool written = false;  // some rank wrote it
  std::string digest;    // in the coordinator's store, when sent there
  int64_t bytes = 0;
};

struct LoadedCheckpoint {
  int64_t global_step = 0;
  int64_t epoch = 0;
  std::vector<v1::CallbackState> callbacks = {};  // the file's, for the callbacks to resume from
};

// How every WorkerGroup reports a lost worker: UNAVAILABLE, naming the call (`what`), the worker
// with its ranks (`worker`: "worker 'w1' (rank 1)") and why it was lost.
absl::Status WorkerLostError(const std::string& what, const std::string& worker,
                             const std::string& why);

class WorkerGroup {
 public:
  virtual ~WorkerGroup() = default;

  // Workers (machines) in the group; each hosts one or more ranks.
  virtual int size() const = 0;

  // Builds the job on every worker; the ranks form the job's group. `clear_stale_runs`: first
  // tear down a run of this job a previous coordinator left on the workers.
  virtual absl::StatusOr<GroupSetup> Setup(const v1::JobSpec& spec, const SetupContext& context,
                                           bool clear_stale_runs) = 0;
  virtual absl::StatusOr<TrainResult> Train(const TrainCall& call) = 0;
  // Pipelined training calls (trainer.pipelined_calls): StartTrain sends a call and returns at
  // once; FinishTrain answers the oldest call started and not yet finished, as Train would. A
  // call started while another is unfinished goes out pipelined: each worker runs it right
  // after that one (StepRequest.pipelined). AbandonTrain cancels every unfinished call and
  // waits for them, for a loop that ends with one in flight. The defaults run each call in
  // FinishTrain, for a group where the overlap buys nothing (the in-process fake).
  virtual void StartTrain(const TrainCall& call) { unstarted_.push_back(call); }
  virtual absl::StatusOr<TrainResult> FinishTrain();
  virtual void AbandonTrain() { unstarted_.clear(); }
  virtual absl::StatusOr<EvalResult> Evaluate(EvalKind kind, const RankBatches& batches) = 0;
  virtual absl::StatusOr<PredictResult> Predict(const PredictCall& call) = 0;
  // Every rank saves; global rank 0 writes.
  virtual absl::StatusOr<SavedCheckpoint> Save(const SaveCall& call) = 0;
  // Every rank loads `path` (as a worker reads it: an artifact reference or a worker path).
  virtual absl::StatusOr<LoadedCheckpoint> Load(const std::string& path) = 0;
  // reduce_boolean_decision(any) across the ranks, each giving by_rank[rank].
  virtual absl::StatusOr<bool> AnyRankDecides(const std::vector<bool>& by_rank) = 0;

  // Releases every worker, bounded in time, cancelled or not.
  virtual void Teardown() = 0;
  // Stops the calls under way and every later one (CANCELLED).
  virtual void Cancel() = 0;
  virtual bool cancelled() const = 0;
  // The registry holds `worker` LOST (`why`): calls under way stop, and they and every later
  // call answer UNAVAILABLE naming it. Unknown names are ignored.
  virtual void MarkLost(const std::string& worker, const std::string& why) = 0;
  // Workers a call could not reach, or marked lost.
  virtual std::vector<std::string> unreachable() const = 0;
  // After Teardown: the unreachable ones and those whose teardown failed.
  virtual std::vector<std::string> lost() const = 0;

 private:
  std::deque<TrainCall> unstarted_;  // the default StartTrain's
};

}  // namespace dtrain
