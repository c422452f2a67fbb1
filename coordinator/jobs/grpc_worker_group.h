// GrpcWorkerGroup: the WorkerGroup of a run in production: the placed workers' Worker services
// over gRPC. It owns the wire format (SetupRequest, StepRequest, the responses and their
// tensors); the fan-out with deadlines, the naming of a failed worker and the lost-worker
// bookkeeping are RunWorkers'.
//
// Thread-safety: as WorkerGroup.
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "coordinator/jobs/run_workers.h"
#include "coordinator/jobs/worker_group.h"
#include "dtrain/v1/workers.pb.h"

namespace dtrain {

class GrpcWorkerGroup final : public WorkerGroup {
 public:
  // `setup_timeout`: the group forms within it (Setup's deadline has 30 s more for loading the
  // model and data); `step_timeout`: every other call's deadline.
  GrpcWorkerGroup(std::string job_id, std::vector<v1::WorkerInfo> workers,
                  absl::Duration setup_timeout, absl::Duration step_timeout);

  // A loop that left calls in flight: they are cancelled and waited for (they use its messages).
  ~GrpcWorkerGroup() override { AbandonTrain(); }

  int size() const override { return workers_.size(); }
  absl::StatusOr<GroupSetup> Setup(const v1::JobSpec& spec, const SetupContext& context,
                                   bool clear_stale_runs) override;
  absl::StatusOr<TrainResult> Train(const TrainCall& call) override;
  void StartTrain(const TrainCall& call) override;
  absl::StatusOr<TrainResult> FinishTrain() override;
  void AbandonTrain() override;
  absl::StatusOr<EvalResult> Evaluate(EvalKind kind, const RankBatches& batches) override;
  absl::StatusOr<PredictResult> Predict(const PredictCall& call) override;
  absl::StatusOr<SavedCheckpoint> Save(const SaveCall& call) override;
  absl::StatusOr<LoadedCheckpoint> Load(const std::string& path) override;
  absl::StatusOr<bool> AnyRankDecides(const std::vector<bool>& by_rank) override;

  void Teardown() override {
    AbandonTrain();
    workers_.Teardown();
  }
  void Cancel() override { workers_.Cancel(); }
  bool cancelled() const override { return workers_.cancelled(); }
  void MarkLost(const std::string& worker, const std::string& why) override {
    workers_.MarkLost(worker, why);
  }
  std::vector<std::string> unreachable() const override { return workers_.unreachable(); }
  std::vector<std::string> lost() const override { return workers_.lost(); }

 private:
  // One request per worker, its LocalWork per local rank holding batches [first, first + count)
  // of each rank's list (clipped to what the rank has).
  std::vector<v1::StepRequest> StepRequests(const std::string& split, const RankBatches& batches,
                                            int64_t first, int64_t count) const;
  // One request per worker naming the call's batches by their sampler (LocalWork.sampled).
  std::vector<v1::StepRequest> SampledRequests(const TrainCall& call) const;

  // INTERNAL naming `what` while training calls are unfinished.
  absl::Status NoTrainingInFlight(const std::string& what) const;
  // A training call sent and not yet finished; its messages stay put until it answers.
  struct TrainInFlight {
    int64_t first = 0;  // the call's first batch
    int64_t count = 0;  // batches a rank
    std::vector<v1::StepRequest> requests;
    std::vector<v1::StepResponse> responses;
    RunWorkers::InFlight calls;
  };

  const std::string job_id_;
  const absl::Duration setup_timeout_;
  const absl::Duration step_timeout_;
  RunWorkers workers_;
  int world_ = 0;
  std::deque<std::unique_ptr<TrainInFlight>> training_;  // oldest first
};

}  // namespace dtrain
