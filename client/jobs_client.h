// JobsClient: the Jobs service (submit, get, list, watch, cancel, logs, metrics) and the
// Workers service's list as plain C++ calls with deadlines and absl::Status errors. The dtrain
// command line is built on it, so programs and tests make exactly the CLI's calls.
//
// Thread-safety: one JobsClient may be used from several threads at once.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/channel.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "dtrain/v1/jobs.grpc.pb.h"
#include "dtrain/v1/workers.grpc.pb.h"

namespace dtrain {

class JobsClient {
 public:
  // A channel to `address` (host:port) through ConnectToCoordinator (TLS and the process's
  // token when configured); every call but Watch has `timeout` as its deadline.
  explicit JobsClient(const std::string& address, absl::Duration timeout = absl::Seconds(10));
  JobsClient(std::shared_ptr<grpc::Channel> channel, absl::Duration timeout);

  // INVALID_ARGUMENT naming the spec's field; validate_only: the normalized spec, nothing queued.
  absl::StatusOr<v1::JobStatus> Submit(const v1::JobSpec& spec, bool validate_only = false);
  // SubmitJob with dry_run: an idle worker loads the model and data and runs one training and
  // one validation step; nothing is queued. Its own deadline: loading may take a while.
  absl::StatusOr<v1::DryRunResponse> DryRun(const v1::JobSpec& spec,
                                            absl::Duration timeout = absl::Minutes(5));
  absl::StatusOr<v1::JobStatus> Get(const std::string& id);
  // Every job (newest > 0: only the newest that many), by submission time, without specs;
  // `total` (optional) gets how many jobs the coordinator knows.
  absl::StatusOr<std::vector<v1::JobStatus>> List(int newest = 0, int* total = nullptr);
  // FAILED_PRECONDITION when the job already ended.
  absl::StatusOr<v1::JobStatus> Cancel(const std::string& id);
  // FAILED_PRECONDITION while the job is queued or running.
  absl::StatusOr<v1::DeleteJobResponse> Delete(const std::string& id);
  // The job's log from line `from_line`; `next_line` is where the next read starts.
  absl::StatusOr<v1::GetJobLogsResponse> Logs(const std::string& id, int64_t from_line = 0);
  absl::StatusOr<std::vector<v1::MetricPoint>> Metrics(const std::string& id);
  // Calls `on_update` with the status now and after every change until the job ends, and
  // returns the last one. No deadline: a watch lasts as long as the job (a dead or frozen
  // coordinator is noticed through the channel's keepalive within ~15 s, common/channel.cc).
  // UNAVAILABLE when the stream closed early.
  absl::StatusOr<v1::JobStatus> Watch(const std::string& id,
                                      const std::function<void(const v1::JobStatus&)>& on_update);
  // The registered workers, by name (Workers.ListWorkers, every page).
  absl::StatusOr<std::vector<v1::WorkerInfo>> Workers();

  const v1::Jobs::StubInterface& stub() const { return *jobs_; }

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Jobs::Stub> jobs_;
  std::unique_ptr<v1::Workers::Stub> workers_;
  const absl::Duration timeout_;
};

}  // namespace dtrain
