#include "coordinator/jobs/jobs_service.h"

#include <algorithm>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/callback_reactors.h"
#include "common/grpc_status.h"
#include "common/job_spec.h"
#include "common/streaming.h"

namespace dtrain {
namespace {

// Payload per response, well inside a default client's 4 MiB with the message's own framing.
constexpr size_t kResponseBudget = static_cast<size_t>(kStreamChunkBytes);

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

grpc::ServerUnaryReactor* JobsService::SubmitJob(grpc::CallbackServerContext* context,
                                                 const v1::SubmitJobRequest* request,
                                                 v1::SubmitJobResponse* response) {
  if (absl::Status s = access_->RequireAdmin(*context, "SubmitJob"); !s.ok())
    return FinishNow(context, s);
  if (request->dry_run()) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    absl::StatusOr<v1::JobStatus> checked = jobs_->Submit(request->spec(), /*validate_only=*/true);
    if (!checked.ok()) {
      reactor->Finish(ToGrpcStatus(checked.status()));
      return reactor;
    }
    *response->mutable_job() = std::move(*checked);
    jobs_->DryRun(request->spec(), [reactor, response](absl::StatusOr<v1::DryRunResponse> report) {
      if (report.ok()) *response->mutable_dry_run() = std::move(*report);
      reactor->Finish(ToGrpcStatus(report.status()));
    });
    return reactor;
  }
  absl::StatusOr<v1::JobStatus> job = jobs_->Submit(request->spec(), request->validate_only());
  if (job.ok()) *response->mutable_job() = std::move(*job);
  return FinishNow(context, job.status());
}

grpc::ServerUnaryReactor* JobsService::GetJob(grpc::CallbackServerContext* context,
                                              const v1::GetJobRequest* request,
                                              v1::JobStatus* response) {
  if (absl::Status s = access_->RequireAdmin(*context, "GetJob"); !s.ok())
    return FinishNow(context, s);
  absl::StatusOr<v1::JobStatus> job = jobs_->Get(request->id(), /*with_spec=*/true);
  if (job.ok()) *response = std::move(*job);
  return FinishNow(context, job.status());
}

grpc::ServerUnaryReactor* JobsService::ListJobs(grpc::CallbackServerContext* context,
                                                const v1::ListJobsRequest* request,
                                                v1::ListJobsResponse* response) {
  if (absl::Status s = access_->RequireAdmin(*context, "ListJobs"); !s.ok())
    return FinishNow(context, s);
  if (request->page_size() < 0) {
    return FinishNow(
        context, absl::InvalidArgumentError(absl::StrCat(
                     "page_size must be >= 0 (0: as many as fit), got ", request->page_size())));
  }
  size_t first = 0;
  if (!request->page_token().empty() && !absl::SimpleAtoi(request->page_token(), &first)) {
    return FinishNow(context, absl::InvalidArgumentError(absl::StrCat(
                                  "page_token '", request->page_token(),
                                  "' is not one this service gave; pass next_page_token as is")));
  }
  // Copied a chunk at a time, so a page costs what it holds, not the whole history.
  constexpr size_t kChunk = 256;
  size_t bytes = 0, i = first, total = 0;
  bool full = false;
  while (!full) {
    size_t want = kChunk;
    if (request->page_size() > 0) {
      want = std::min(want, static_cast<size_t>(request->page_size() - response->jobs_size()));
    }
    std::vector<v1::JobStatus> chunk = jobs_->List(i, want, request->newest_first(), &total);
    if (chunk.empty()) break;
    for (v1::JobStatus& job : chunk) {
      const size_t size = job.ByteSizeLong() + 8;
      if (response->jobs_size() > 0 && bytes + size > kResponseBudget) {
        full = true;
        break;
      }
      bytes += size;
      *response->add_jobs() = std::move(job);
      ++i;
    }
    if (request->page_size() > 0 && response->jobs_size() == request->page_size()) full = true;
  }
  if (i < total) response->set_next_page_token(absl::StrCat(i));
  response->set_total_size(static_cast<int32_t>(total));
  return FinishNow(context, absl::OkStatus());
}

grpc::ServerWriteReactor<v1::JobStatus>* JobsService::WatchJob(grpc::CallbackServerContext* context,
                                                               const v1::WatchJobRequest* request) {
  return new WatchReactor(jobs_, request->id(), access_->RequireAdmin(*context, "WatchJob"));
}

grpc::ServerUnaryReactor* JobsService::CancelJob(grpc::CallbackServerContext* context,
                                                 const v1::CancelJobRequest* request,
                                                 v1::JobStatus* response) {
  if (absl::Status s = access_->RequireAdmin(*context, "CancelJob"); !s.ok())
    return FinishNow(context, s);
  absl::StatusOr<v1::JobStatus> job = jobs_->Cancel(request->id());
  if (job.ok()) *response = std::move(*job);
  return FinishNow(context, job.status());
}

grpc::ServerUnaryReactor* JobsService::DeleteJob(grpc::CallbackServerContext* context,
                                                 const v1::DeleteJobRequest* request,
                                                 v1::DeleteJobResponse* response) {
  if (absl::Status s = access_->RequireAdmin(*context, "DeleteJob"); !s.ok())
    return FinishNow(context, s);
  // Inline: an ended job's teardown is over or about to be (JobManager::Delete waits for it).
  absl::StatusOr<v1::DeleteJobResponse> deleted = jobs_->Delete(request->id());
  if (deleted.ok()) *response = std::move(*deleted);
  return FinishNow(context, deleted.status());
}

grpc::ServerUnaryReactor* JobsService::GetJobLogs(grpc::CallbackServerContext* context,
                                                  const v1::GetJobLogsRequest* request,
                                                  v1::GetJobLogsResponse* response) {
  if (absl::Status s = access_->RequireAdmin(*context, "GetJobLogs"); !s.ok())
    return FinishNow(context, s);
  int64_t next = 0;
  absl::StatusOr<std::vector<std::string>> lines =
      jobs_->Logs(request->id(), request->from_line(), &next);
  if (lines.ok()) {
    size_t bytes = 0, taken = 0;
    for (std::string& line : *lines) {
      if (line.size() > kResponseBudget / 2) line.resize(kResponseBudget / 2);  // never in practice
      if (bytes + line.size() + 8 > kResponseBudget) break;
      bytes += line.size() + 8;
      response->add_lines(std::move(line));
      ++taken;
    }
    const bool truncated = taken < lines->size();
    response->set_truncated(truncated);
    response->set_next_line(truncated ? std::max<int64_t>(request->from_line(), 0) + taken : next);
  }
  return FinishNow(context, lines.status());
}

grpc::ServerUnaryReactor* JobsService::GetJobMetrics(grpc::CallbackServerContext* context,
                                                     const v1::GetJobMetricsRequest* request,
                                                     v1::GetJobMetricsResponse* response) {
  if (absl::Status s = access_->RequireAdmin(*context, "GetJobMetrics"); !s.ok())
    return FinishNow(context, s);
  if (request->from_point() < 0) {
    return FinishNow(context, absl::InvalidArgumentError(absl::StrCat(
                                  "from_point must be >= 0, got ", request->from_point())));
  }
  absl::StatusOr<std::vector<v1::MetricPoint>> points = jobs_->Metrics(request->id());
  if (points.ok()) {
    size_t bytes = 0;
    size_t i = std::min<size_t>(request->from_point(), points->size());
    for (; i < points->size(); ++i) {
      const size_t size = (*points)[i].ByteSizeLong() + 8;
      if (bytes + size > kResponseBudget) break;
      bytes += size;
      *response->add_points() = std::move((*points)[i]);
    }
    response->set_next_point(static_cast<int64_t>(i));
    response->set_truncated(i < points->size());
  }
  return FinishNow(context, points.status());
}

}  // namespace dtrain
