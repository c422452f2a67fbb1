#include "client/jobs_client.h"

#include <algorithm>

#include <grpcpp/client_context.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/channel.h"
#include "common/grpc_status.h"

namespace dtrain {
namespace {

// One unary call with a deadline; its grpc::Status as an absl::Status.
template <typename Call>
absl::Status Unary(absl::Duration timeout, Call call) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  return FromGrpcStatus(call(&context));
}

}  // namespace

JobsClient::JobsClient(const std::string& address, absl::Duration timeout)
    : JobsClient(ConnectToCoordinator(address), timeout) {}

JobsClient::JobsClient(std::shared_ptr<grpc::Channel> channel, absl::Duration timeout)
    : channel_(std::move(channel)),
      jobs_(v1::Jobs::NewStub(channel_)),
      workers_(v1::Workers::NewStub(channel_)),
      timeout_(timeout) {}

absl::StatusOr<v1::JobStatus> JobsClient::Submit(const v1::JobSpec& spec, bool validate_only) {
  v1::SubmitJobRequest request;
  *request.mutable_spec() = spec;
  request.set_validate_only(validate_only);
  v1::SubmitJobResponse response;
  absl::Status status = Unary(timeout_, [&](grpc::ClientContext* context) {
    return jobs_->SubmitJob(context, request, &response);
  });
  if (!status.ok()) return status;
  return std::move(*response.mutable_job());
}

absl::StatusOr<v1::DryRunResponse> JobsClient::DryRun(const v1::JobSpec& spec,
                                                      absl::Duration timeout) {
  v1::SubmitJobRequest request;
  *request.mutable_spec() = spec;
  request.set_dry_run(true);
  v1::SubmitJobResponse response;
  absl::Status status = Unary(timeout, [&](grpc::ClientContext* context) {
    return jobs_->SubmitJob(context, request, &response);
  });
  if (!status.ok()) return status;
  return std::move(*response.mutable_dry_run());
}

absl::StatusOr<v1::JobStatus> JobsClient::Get(const std::string& id) {
  v1::GetJobRequest request;
  request.set_id(id);
  v1::JobStatus response;
  absl::Status status = Unary(timeout_, [&](grpc::ClientContext* context) {
    return jobs_->GetJob(context, request, &response);
  });
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<std::vector<v1::JobStatus>> JobsClient::List(int newest, int* total) {
  std::vector<v1::JobStatus> jobs;
  v1::ListJobsRequest request;
  request.set_newest_first(newest > 0);
  do {
    if (newest > 0) request.set_page_size(newest - static_cast<int>(jobs.size()));
    v1::ListJobsResponse response;
    absl::Status status = Unary(timeout_, [&](grpc::ClientContext* context) {
      return jobs_->ListJobs(context, request, &response);
    });
    if (!status.ok()) return status;
    jobs.insert(jobs.end(), response.jobs().begin(), response.jobs().end());
    if (total != nullptr) *total = response.total_size();
    request.set_page_token(response.next_page_token());
  } while (!request.page_token().empty() &&
           (newest <= 0 || static_cast<int>(jobs.size()) < newest));
  if (newest > 0) std::reverse(jobs.begin(), jobs.end());
  return jobs;
}

absl::StatusOr<v1::JobStatus> JobsClient::Cancel(const std::string& id) {
  v1::CancelJobRequest request;
  request.set_id(id);
  v1::JobStatus response;
  absl::Status status = Unary(timeout_, [&](grpc::ClientContext* context) {
    return jobs_->CancelJob(context, request, &response);
  });
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<v1::DeleteJobResponse> JobsClient::Delete(const std::string& id) {
  v1::DeleteJobRequest request;
  request.set_id(id);
  v1::DeleteJobResponse response;
  // The coordinator may first wait for the ended job's teardown (up to a minute).
  absl::Status status = Unary(
      std::max(timeout_, absl::Seconds(90)),
      [&](grpc::ClientContext* context) { return jobs_->DeleteJob(context, request, &response); });
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<v1::GetJobLogsResponse> JobsClient::Logs(const std::string& id, int64_t from_line) {
  v1::GetJobLogsRequest request;
  request.set_id(id);
  request.set_from_line(from_line);
  v1::GetJobLogsResponse all;
  while (true) {
    v1::GetJobLogsResponse response;
    absl::Status status = Unary(timeout_, [&](grpc::ClientContext* context) {
      return jobs_->GetJobLogs(context, request, &response);
    });
    if (!status.ok()) return status;
    for (std::string& line : *response.mutable_lines()) all.add_lines(std::move(line));
    all.set_next_line(response.next_line());
    if (!response.truncated()) return all;
    request.set_from_line(response.next_line());
  }
}

absl::StatusOr<std::vector<v1::MetricPoint>> JobsClient::Metrics(const std::string& id) {
  v1::GetJobMetricsRequest request;
  request.set_id(id);
  std::vector<v1::MetricPoint> points;
  while (true) {
    v1::GetJobMetricsResponse response;
    absl::Status status = Unary(timeout_, [&](grpc::ClientContext* context) {
      return jobs_->GetJobMetrics(context, request, &response);
    });
    if (!status.ok()) return status;
    points.insert(points.end(), response.points().begin(), response.points().end());
    if (!response.truncated()) return points;
    request.set_from_point(response.next_point());
  }
}

absl::StatusOr<v1::JobStatus> JobsClient::Watch(
    const std::string& id, const std::function<void(const v1::JobStatus&)>& on_update) {
  grpc::ClientContext context;
  v1::WatchJobRequest request;
  request.set_id(id);
  auto reader = jobs_->WatchJob(&context, request);
  v1::JobStatus status, last;
  bool any = false;
  while (reader->Read(&status)) {
    last = status;
    any = true;
    if (on_update) on_update(status);
  }
  if (absl::Status end = FromGrpcStatus(reader->Finish()); !end.ok()) return end;
  if (!any) {
    return absl::UnavailableError(
        absl::StrCat("the coordinator closed the watch of job '", id, "' without a status"));
  }
  return last;
}

absl::StatusOr<std::vector<v1::WorkerInfo>> JobsClient::Workers() {
  std::vector<v1::WorkerInfo> workers;
  v1::ListWorkersRequest request;
  do {
    v1::ListWorkersResponse response;
    absl::Status status = Unary(timeout_, [&](grpc::ClientContext* context) {
      return workers_->ListWorkers(context, request, &response);
    });
    if (!status.ok()) return status;
    // A page resumes after the last name of the one before: the same token again is no
    // progress, and asking on would never end.
    if (!response.next_page_token().empty() && response.next_page_token() == request.page_token()) {
      return absl::InternalError("the coordinator answered ListWorkers' page with its own token");
    }
    for (v1::WorkerInfo& w : *response.mutable_workers()) workers.push_back(std::move(w));
    request.set_page_token(response.next_page_token());
  } while (!request.page_token().empty());
  return workers;
}

}  // namespace dtrain
