// Calls to several servers at once, for a caller that needs all of them (the trainer's steps on
// every worker, a ddp_spawn daemon's calls to its children). Once one call fails, the others
// get a grace period to finish and are then cancelled, so one hung peer cannot hold the caller.
// CancelAll, from any thread, cancels whatever is running (a cancelled job).
#pragma once

#include <functional>
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

  // Runs call(i, context) for i in [0, n) on their own threads; returns every call's status.
  // `deadline` (if not infinite) is set on every context.
  std::vector<grpc::Status> Run(int n, const Call& call, absl::Duration grace = absl::Seconds(5),
                                absl::Time deadline = absl::InfiniteFuture());

  // Cancels every call running now; calls started later are not affected.
  void CancelAll();

 private:
  absl::Mutex mu_;
  std::vector<grpc::ClientContext*> running_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dtrain
