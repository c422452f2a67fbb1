// One job on one rank: what a worker process builds from a SetupRequest (model, data,
// accelerator with its precision plugin and strategy, and the job's group) and the step loops
// that run the step RPCs' batches through it. The service (worker/service/worker_service.h) turns
// requests into calls here and statuses into gRPC codes.
//
// Thread-safety: one RPC at a time, except Cancel, which any thread may call.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/call_canceller.h"
#include "dtrain/v1/worker.pb.h"
#include "worker/data/dataset.h"
#include "worker/model/step_kind.h"
#include "worker/runtime/accelerator.h"
#include "worker/runtime/sampled_epoch.h"
#include "worker/runtime/worker_identity.h"

namespace dtrain {

class Job {
 public:
  // `request` as PrepareSetup (worker/runtime/hosted_job.h) leaves it: its spec normalized
  // (NormalizeSetupRequest) and its paths local. Checks what the spec names against this worker
  // (plugins, devices, files, the model's methods: INVALID_ARGUMENT / NOT_FOUND /
  // FAILED_PRECONDITION naming the field, "spec.model: ..."), then joins the group (blocking
  // until every rank has joined) and sets up. `cancel` (optional) ends the wait for the group:
  // the caller gave up.
  static absl::StatusOr<std::unique_ptr<Job>> Setup(const v1::SetupRequest& request,
                                                    const WorkerIdentity& identity,
                                                    CallCanceller* cancel = nullptr);

  // Worker.DryRun: the model and data of request.setup() alone on this process (single_device,
  // no group), one training_step on the first training batch and one validation_step on the
  // first validation batch, in no_grad; the optimizer is never stepped.
  static absl::StatusOr<v1::DryRunResponse> DryRun(const v1::DryRunRequest& request,
                                                   const WorkerIdentity& identity);

  const std::string& id() const { return id_; }
  v1::RankInfo rank_info() const;
  void Describe(v1::SetupResponse* response) const;

  // Trains on the work's batches: per batch, training_step, backward, and (at the end of
  // each accumulation window) clipping, the optimizer step and the global step.
  // end_of_epoch: the last batch closes the accumulation window. total_steps: the run's
  // optimizer steps (0: not known), for a schedule whose length is the run's. monitored: the
  // ReduceLROnPlateau monitors' values at the end of epoch - 1 (StepRequest.monitored).
  absl::StatusOr<v1::LocalResult> Train(const v1::LocalWork& work, int64_t epoch,
                                        bool end_of_epoch = false, int64_t total_steps = 0,
                                        const std::map<std::string, double>& monitored = {},
                                        std::vector<CallbackStateDict> callbacks = {});
  // kind: validation, test or predict; eval mode, no grad. sanity_check: Lightning's sanity
  // validation (StepRequest.sanity_check): the CPU random generator is put back afterwards.
  absl::StatusOr<v1::LocalResult> Evaluate(StepKind kind, const v1::LocalWork& work,
                                           bool return_outputs, bool sanity_check = false);
  // total_steps: as Train's, for a schedule that has not had a step to learn it from.
  // monitored: as Train's, for the epoch that ends here (SaveCheckpointRequest.monitored).
  absl::StatusOr<bool> SaveCheckpoint(const std::string& path, int64_t epoch,
                                      const std::string& job_spec_json = "",
                                      int64_t total_steps = 0,
                                      const std::map<std::string, double>& monitored = {},
                                      std::vector<CallbackStateDict> callbacks = {});
  absl::StatusOr<TrainingProgress> LoadCheckpoint(const std::string& path);
  absl::Status StateDict(v1::StateDictResponse* response);
  // `all_ranks`: every rank is torn down at once (the coordinator's TeardownRequest.all_ranks),
  // so the strategy's teardown barrier runs before the group is left.
  absl::Status Teardown(bool all_ranks = false);

  // Makes the running loop stop before its next batch (CANCELLED), and a collective it waits
  // in give up: the peers stop at their own next batch, which may be an earlier one.
  void Cancel();

  Accelerator& accelerator() { return *accelerator_; }

 private:
  Job() = default;
  // The i-th batch of `work` (tensors or indices), on the CPU.
  // `epoch`: a streamed split's batches are positions in the rank's epoch.
  absl::StatusOr<c10::IValue> BatchAt(const v1::LocalWork& work, int i, int64_t epoch,
                                      std::vector<int64_t>* kept = nullptr) const;
  static int BatchCount(const v1::LocalWork& work);
  // A training call's LocalWork.sampled, checked against this rank's dataset and epoch, and
  // its indices dealt (sampled_). OK for work that lists its batches.
  absl::Status DealSampled(const v1::LocalWork& work, int64_t epoch);
  // A step begins: a cancel stops the step it interrupts, not the job.
  void ClearCancel();
  // Lightning's dispatch, at the run's first step.
  absl::Status Dispatch();
  // on_train_end (the model's, then the accelerator's), once, if training started.
  absl::Status EndTraining();

  std::string id_;
  std::string cpus_;  // --cpus of this process, for RankInfo
  std::unique_ptr<Dataset> data_;
  std::unique_ptr<Accelerator> accelerator_;
  int accumulate_ = 1;
  double clip_val_ = 0;
  ClipAlgorithm clip_algorithm_ = ClipAlgorithm::kNorm;
  int64_t accumulated_ = 0;  // batches in the current accumulation window
  // Lightning's hooks: which have been called in this run.
  bool train_started_ = false;
  bool train_ended_ = false;
  bool dispatched_ = false;
  int64_t train_epoch_ = -1;  // the epoch on_train_epoch_start was last called for
  std::atomic<bool> cancelled_{false};
  std::string plane_;       // the collectives' data plane (distributed strategies)
  std::string plane_note_;  // why it is not the fastest one
  absl::Duration group_formation_;
  StorageOptions storage_options_;  // the spec's checkpoint.storage_options, for every save
  std::string optimization_;        // what it trains with, for SetupResponse.optimization
  SampledEpoch sampled_;            // the epoch LocalWork.sampled last dealt
};

}  // namespace dtrain
