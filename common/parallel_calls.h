// Calls to several servers at once, for a caller that needs all of them (the trainer's steps on
// every worker, a ddp_spawn daemon's calls to its children). Once one call fails, the others
// get a grace period to finish and are then cancelled, so one hung peer cannot hold the caller.
// CancelAll, from any thread, cancels whatever is running (a cancelled job).
//
// The calls run on threads the instance keeps between Runs: a job calls every worker at every
// step, and creating (and unmapping) a thread per call was most of the coordinator's kernel time
// at 1,000 workers (bench/coordinator_scale.sh). Each call of a Run gets a thread of its own at
// once, never a queue slot behind another call: the calls are often the ranks of one
// collective, which block until all of them have started.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include <grpcpp/client_context.h>
#include <grpcpp/support/status.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace dtrain {

class ParallelCalls {
 public:
  using Call = std::function<grpc::Status(int index, grpc::ClientContext* context)>;

  ParallelCalls() = default;
  ParallelCalls(const ParallelCalls&) = delete;
  ParallelCalls& operator=(const ParallelCalls&) = delete;
  // Joins the kept threads (no Run may be in progress).
  ~ParallelCalls();

  // Runs call(i, context) for i in [0, n), each on a thread of its own; returns every call's
  // status.
  // `deadline` (if not infinite) is set on every context.
  std::vector<grpc::Status> Run(int n, const Call& call, absl::Duration grace = absl::Seconds(5),
                                absl::Time deadline = absl::InfiniteFuture());

  // The same with the callback API and no thread at all: start(i, context, done) starts call i
  // without blocking and arranges for done(status) to be called exactly once (a stub's
  // async()->Method(context, &request, &response, done)). The hot path: a job's steps.
  using Done = std::function<void(grpc::Status)>;
  using AsyncCall = std::function<void(int index, grpc::ClientContext* context, Done done)>;
  std::vector<grpc::Status> RunAsync(int n, const AsyncCall& start,
                                     absl::Duration grace = absl::Seconds(5),
                                     absl::Time deadline = absl::InfiniteFuture());

  // RunAsync in two halves, so that the caller can start more calls before these answer (a
  // job's pipelined training calls): Start begins the calls and returns at once; Wait returns
  // what RunAsync would have. Every Started must be Waited for before this instance goes.
  class Started {
   public:
    explicit Started(int n) : contexts(n), outcome(std::make_shared<Outcome>(n)) {}
    // Shared with the completions: a kept thread or gRPC's may still be leaving mu when Wait
    // returns.
    struct Outcome {
      explicit Outcome(int n) : results(n), finished(n, false) {}
      absl::Mutex mu;
      std::vector<grpc::Status> results ABSL_GUARDED_BY(mu);
      std::vector<bool> finished ABSL_GUARDED_BY(mu);
      int done ABSL_GUARDED_BY(mu) = 0;
      bool failed ABSL_GUARDED_BY(mu) = false;
    };
    std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
    std::shared_ptr<Outcome> outcome;
  };
  std::unique_ptr<Started> Start(int n, const AsyncCall& start,
                                 absl::Time deadline = absl::InfiniteFuture());
  std::vector<grpc::Status> Wait(std::unique_ptr<Started> started,
                                 absl::Duration grace = absl::Seconds(5));
  // Cancels the calls of `started` only (those of other Runs go on).
  static void Cancel(Started& started);

  // Cancels every call running now; calls started later are not affected.
  void CancelAll();

 private:
  using StartAll = std::function<void(const std::vector<std::pair<grpc::ClientContext*, Done>>&)>;
  // Makes the contexts and lets start_all begin every call.
  std::unique_ptr<Started> Begin(int n, const StartAll& start_all, absl::Time deadline);
  // Hands `tasks` to idle kept threads, starting more when fewer are idle than tasks.
  void Dispatch(std::vector<std::function<void()>> tasks);
  void Serve();

  absl::Mutex mu_;
  std::vector<grpc::ClientContext*> running_ ABSL_GUARDED_BY(mu_);

  absl::Mutex pool_mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(pool_mu_);
  int idle_ ABSL_GUARDED_BY(pool_mu_) = 0;  // threads waiting with no task promised to them
  bool stopping_ ABSL_GUARDED_BY(pool_mu_) = false;
  std::vector<std::thread> threads_;  // only Dispatch (under pool_mu_) and the destructor
};

}  // namespace dtrain
