#include "coordinator/jobs/jobs_service.h"

#include <optional>

#include "absl/synchronization/mutex.h"
#include "common/callback_reactors.h"
#include "common/grpc_status.h"
#include "common/job_spec.h"
#include "common/status_macros.h"

namespace dtrain {
namespace {

// Writes the newest status whenever the previous write is done; ends after the terminal one.
class WatchReactor final : public grpc::ServerWriteReactor<v1::JobStatus> {
 public:
  WatchReactor(JobManager* jobs, std::string id, const absl::Status& allowed)
      : jobs_(jobs), id_(std::move(id)) {
    if (!allowed.ok()) {
      absl::MutexLock lock(&mu_);
      finished_ = true;
      Finish(ToGrpcStatus(allowed));
      return;
    }
    absl::StatusOr<int64_t> handle =
        jobs_->Watch(id_, [this](const v1::JobStatus& status) { Offer(status); });
    absl::MutexLock lock(&mu_);
    if (!handle.ok()) {
      finished_ = true;
      Finish(ToGrpcStatus(handle.status()));
      return;
    }
    handle_ = *handle;
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) {
      EndLocked(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the watcher went away"));
      return;
    }
    if (IsTerminal(current_.state())) {
      EndLocked(grpc::Status::OK);
      return;
    }
    WriteNextLocked();
  }

  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    EndLocked(grpc::Status::CANCELLED);
  }

  void OnDone() override {
    // After Unwatch returns no callback is running or will run: deleting is safe.
    if (handle_ >= 0) jobs_->Unwatch(id_, handle_);
    delete this;
  }

 private:
  void Offer(const v1::JobStatus& status) {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    pending_ = status;
    if (!writing_) WriteNextLocked();
  }

  void WriteNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!pending_.has_value() || finished_) return;
    current_ = std::move(*pending_);
    pending_.reset();
    writing_ = true;
    StartWrite(&current_);
  }

  void EndLocked(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    finished_ = true;
    Finish(status);
  }

  JobManager* const jobs_;
  const std::string id_;
  int64_t handle_ = -1;
  absl::Mutex mu_;
  std::optional<v1::JobStatus> pending_ ABSL_GUARDED_BY(mu_);
  v1::JobStatus current_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

absl::Status JobsService::Authorize(const grpc::CallbackServerContext& context,
                                    absl::string_view what) const {
  DTRAIN_ASSIGN_OR_RETURN(Caller caller, access_->Authenticate(context));
  return caller.MayAdminister(what);
}

grpc::ServerUnaryReactor* JobsService::SubmitJob(grpc::CallbackServerContext* context,
                                                 const v1::SubmitJobRequest* request,
                                                 v1::SubmitJobResponse* response) {
  if (absl::Status s = Authorize(*context, "SubmitJob"); !s.ok()) return FinishNow(context, s);
  absl::StatusOr<v1::JobStatus> job = jobs_->Submit(request->spec(), request->validate_only());
  if (job.ok()) *response->mutable_job() = std::move(*job);
  return FinishNow(context, job.status());
}

grpc::ServerUnaryReactor* JobsService::GetJob(grpc::CallbackServerContext* context,
                                              const v1::GetJobRequest* request,
                                              v1::JobStatus* response) {
  if (absl::Status s = Authorize(*context, "GetJob"); !s.ok()) return FinishNow(context, s);
  absl::StatusOr<v1::JobStatus> job = jobs_->Get(request->id(), /*with_spec=*/true);
  if (job.ok()) *response = std::move(*job);
  return FinishNow(context, job.status());
}

grpc::ServerUnaryReactor* JobsService::ListJobs(grpc::CallbackServerContext* context,
                                                const v1::ListJobsRequest* request,
                                                v1::ListJobsResponse* response) {
  if (absl::Status s = Authorize(*context, "ListJobs"); !s.ok()) return FinishNow(context, s);
  for (v1::JobStatus& job : jobs_->List()) *response->add_jobs() = std::move(job);
  return FinishNow(context, absl::OkStatus());
}

grpc::ServerWriteReactor<v1::JobStatus>* JobsService::WatchJob(grpc::CallbackServerContext* context,
                                                               const v1::WatchJobRequest* request) {
  return new WatchReactor(jobs_, request->id(), Authorize(*context, "WatchJob"));
}

grpc::ServerUnaryReactor* JobsService::CancelJob(grpc::CallbackServerContext* context,
                                                 const v1::CancelJobRequest* request,
                                                 v1::JobStatus* response) {
  if (absl::Status s = Authorize(*context, "CancelJob"); !s.ok()) return FinishNow(context, s);
  absl::StatusOr<v1::JobStatus> job = jobs_->Cancel(request->id());
  if (job.ok()) *response = std::move(*job);
  return FinishNow(context, job.status());
}

grpc::ServerUnaryReactor* JobsService::GetJobLogs(grpc::CallbackServerContext* context,
                                                  const v1::GetJobLogsRequest* request,
                                                  v1::GetJobLogsResponse* response) {
  if (absl::Status s = Authorize(*context, "GetJobLogs"); !s.ok()) return FinishNow(context, s);
  int64_t next = 0;
  absl::StatusOr<std::vector<std::string>> lines =
      jobs_->Logs(request->id(), request->from_line(), &next);
  if (lines.ok()) {
    for (std::string& line : *lines) response->add_lines(std::move(line));
    response->set_next_line(next);
  }
  return FinishNow(context, lines.status());
}

grpc::ServerUnaryReactor* JobsService::GetJobMetrics(grpc::CallbackServerContext* context,
                                                     const v1::GetJobMetricsRequest* request,
                                                     v1::GetJobMetricsResponse* response) {
  if (absl::Status s = Authorize(*context, "GetJobMetrics"); !s.ok()) return FinishNow(context, s);
  absl::StatusOr<std::vector<v1::MetricPoint>> points = jobs_->Metrics(request->id());
  if (points.ok()) {
    for (v1::MetricPoint& p : *points) *response->add_points() = std::move(p);
  }
  return FinishNow(context, points.status());
}

}  // namespace dtrain
