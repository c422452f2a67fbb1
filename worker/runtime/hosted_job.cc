#include "worker/runtime/hosted_job.h"

#include <cctype>

#include "absl/strings/str_cat.h"
#include "common/job_settings.h"
#include "common/packed_batch_results.h"
#include "common/status_macros.h"
#include "worker/runtime/job.h"

namespace dtrain {
namespace {

std::vector<CallbackStateDict> CallbackStatesFrom(
    const google::protobuf::RepeatedPtrField<v1::CallbackState>& states) {
  std::vector<CallbackStateDict> out;
  for (const v1::CallbackState& s : states) {
    out.push_back({s.key(),
                   {s.ints().begin(), s.ints().end()},
                   {s.floats().begin(), s.floats().end()},
                   {s.tensors().begin(), s.tensors().end()}});
  }
  return out;
}

class LocalJob : public HostedJob {
 public:
  explicit LocalJob(std::unique_ptr<Job> job) : job_(std::move(job)) {}

  const std::string& id() const override { return job_->id(); }
  int local_processes() const override { return 1; }

  absl::Status Step(StepKind kind, const v1::StepRequest& request,
                    v1::StepResponse* response) override {
    if (request.work_size() != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "this worker hosts 1 rank; the step carries work for ", request.work_size()));
    }
    const v1::LocalWork& work = request.work(0);
    absl::StatusOr<v1::LocalResult> result;
    switch (kind) {
      case StepKind::kTraining:
        result = job_->Train(work, request.epoch(), request.end_of_epoch(), request.total_steps(),
                             {request.monitored().begin(), request.monitored().end()});
        break;
      case StepKind::kValidation:
      case StepKind::kTest:
      case StepKind::kPredict:
        result = job_->Evaluate(kind, work, request.return_outputs(), request.sanity_check());
        break;
    }
    if (!result.ok()) return result.status();
    if (kind == StepKind::kTraining && request.packed_results()) PackBatchResults(&*result);
    *response->add_results() = std::move(*result);
    return absl::OkStatus();
  }

  absl::Status SaveCheckpoint(const std::string& path, const v1::SaveCheckpointRequest& request,
                              v1::SaveCheckpointResponse* response) override {
    DTRAIN_ASSIGN_OR_RETURN(
        bool written,
        job_->SaveCheckpoint(path, request.epoch(), request.job_spec_json(), request.total_steps(),
                             {request.monitored().begin(), request.monitored().end()},
                             CallbackStatesFrom(request.callbacks())));
    response->add_written(written);
    return absl::OkStatus();
  }

  absl::Status LoadCheckpoint(const v1::LoadCheckpointRequest& request,
                              v1::LoadCheckpointResponse* response) override {
    DTRAIN_ASSIGN_OR_RETURN(TrainingProgress progress, job_->LoadCheckpoint(request.path()));
    response->set_global_step(progress.global_step);
    response->set_epoch(progress.epoch);
    for (const CallbackStateDict& cb : progress.callbacks) {
      v1::CallbackState* state = response->add_callbacks();
      state->set_key(cb.key);
      state->mutable_ints()->insert(cb.ints.begin(), cb.ints.end());
      state->mutable_floats()->insert(cb.floats.begin(), cb.floats.end());
      state->mutable_tensors()->insert(cb.tensors.begin(), cb.tensors.end());
    }
    return absl::OkStatus();
  }

  absl::Status StateDict(v1::StateDictResponse* response) override {
    return job_->StateDict(response);
  }

  absl::Status ReduceBooleanDecision(const v1::DecisionRequest& request,
                                     v1::DecisionResponse* response) override {
    if (request.decisions_size() != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("this worker hosts 1 rank; the request carries ", request.decisions_size(),
                       " decisions"));
    }
    DTRAIN_ASSIGN_OR_RETURN(bool decision, job_->accelerator().strategy().ReduceBooleanDecision(
                                               request.decisions(0), request.all()));
    response->set_decision(decision);
    return absl::OkStatus();
  }

  absl::Status Teardown(bool all_ranks) override { return job_->Teardown(all_ranks); }

  void Cancel() override { job_->Cancel(); }

 private:
  std::unique_ptr<Job> job_;
};

constexpr size_t kMaxJobIdBytes = 128;

}  // namespace

absl::Status CheckJobId(const std::string& id) {
  if (id.empty()) return absl::InvalidArgumentError("job_id is empty");
  if (id.size() > kMaxJobIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat("job_id is ", id.size(), " bytes; at most 128"));
  }
  for (char c : id) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') {
      return absl::InvalidArgumentError(
          absl::StrCat("job_id '", id, "' may hold only letters, digits, '-', '_' and '.'"));
    }
  }
  // The id names the job's directory under the worker's jobs directory: "." and ".." would name
  // that directory itself or its parent, which teardown removes.
  if (id == "." || id == "..") {
    return absl::InvalidArgumentError(
        absl::StrCat("job_id '", id, "' names a directory, not a job; give the job's id"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<HostedJob>> SetupLocalJob(const v1::SetupRequest& request,
                                                         const WorkerIdentity& identity,
                                                         v1::SetupResponse* response,
                                                         CallCanceller* cancel) {
  DTRAIN_ASSIGN_OR_RETURN(std::unique_ptr<Job> job, Job::Setup(request, identity, cancel));
  job->Describe(response);
  return std::unique_ptr<HostedJob>(new LocalJob(std::move(job)));
}

}  // namespace dtrain
