// JobsService: the gRPC edge of the JobManager (proto/dtrain/v1/jobs.proto), on the callback
// API. WatchJob streams a job's status as it changes, coalescing updates a slow reader has not
// taken yet (it always gets the latest, and the terminal one last). Every call needs the admin
// token: the Jobs API is the cluster's control plane.
#pragma once

#include "coordinator/auth/access_control.h"
#include "coordinator/jobs/job_manager.h"
#include "dtrain/v1/jobs.grpc.pb.h"

namespace dtrain {

class JobsService final : public v1::Jobs::CallbackService {
 public:
  // Every call needs the admin token when `access` is enabled.
  JobsService(JobManager* jobs, const AccessControl* access) : jobs_(jobs), access_(access) {}

  grpc::ServerUnaryReactor* SubmitJob(grpc::CallbackServerContext* context,
                                      const v1::SubmitJobRequest* request,
                                      v1::SubmitJobResponse* response) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* context,
                                   const v1::GetJobRequest* request,
                                   v1::JobStatus* response) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* context,
                                     const v1::ListJobsRequest* request,
                                     v1::ListJobsResponse* response) override;
  grpc::ServerWriteReactor<v1::JobStatus>* WatchJob(grpc::CallbackServerContext* context,
                                                    const v1::WatchJobRequest* request) override;
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* context,
                                      const v1::CancelJobRequest* request,
                                      v1::JobStatus* response) override;
  grpc::ServerUnaryReactor* DeleteJob(grpc::CallbackServerContext* context,
                                      const v1::DeleteJobRequest* request,
                                      v1::DeleteJobResponse* response) override;
  grpc::ServerUnaryReactor* GetJobLogs(grpc::CallbackServerContext* context,
                                       const v1::GetJobLogsRequest* request,
                                       v1::GetJobLogsResponse* response) override;
  grpc::ServerUnaryReactor* GetJobMetrics(grpc::CallbackServerContext* context,
                                          const v1::GetJobMetricsRequest* request,
                                          v1::GetJobMetricsResponse* response) override;

 private:
  JobManager* const jobs_;
  const AccessControl* const access_;
};

}  // namespace dtrain
