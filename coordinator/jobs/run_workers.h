// RunWorkers: the workers of one run of a job, owned in one place: their stubs, which global
// ranks each hosts, and the fan-out of one RPC per worker with a deadline, where the first
// failure names the worker and its ranks and cancels the others' calls after a grace period.
// It also remembers which workers could not be reached or torn down, which is what the job
// manager's re-form decision needs.
//
// Thread-safety: used from the trainer's thread; Cancel may be called from any thread.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/parallel_calls.h"
#include "dtrain/v1/worker.grpc.pb.h"
#include "dtrain/v1/workers.pb.h"

namespace dtrain {

// After one worker's call fails, how long the others get to report their own error before
// their calls are cancelled (they usually fail within milliseconds: the group fails them all).
inline constexpr absl::Duration kFailureGrace = absl::Seconds(2);
inline constexpr absl::Duration kTeardownTimeout = absl::Seconds(10);

class RunWorkers {
 public:
  using Call = std::function<grpc::Status(int worker, grpc::ClientContext* context)>;

  RunWorkers(std::string job_id, std::vector<v1::WorkerInfo> workers);

  int size() const { return static_cast<int>(workers_.size()); }
  v1::Worker::Stub& stub(int worker) { return *stubs_[worker]; }
  const v1::WorkerInfo& info(int worker) const { return workers_[worker]; }

  // The global ranks each worker hosts, by local rank (known once Setup answered).
  void SetRanks(std::vector<std::vector<int>> ranks_of_worker);
  const std::vector<int>& ranks(int worker) const { return ranks_of_worker_[worker]; }
  // "worker 'w1' (rank 1)": how errors and logs name a worker.
  std::string Describe(int worker) const;

  // `call` on every worker at once, each with `timeout`. OK, or the root-cause failure naming
  // the worker: UNAVAILABLE as "lost" (stopped, died, unreachable), others with their code.
  // CANCELLED once Cancel was called.
  absl::Status OnEvery(const std::string& what, const Call& call, absl::Duration timeout);
  // The same with the callback API (ParallelCalls::RunAsync): no thread per call, for steps.
  using AsyncCall = ParallelCalls::AsyncCall;
  absl::Status OnEveryAsync(const std::string& what, const AsyncCall& start,
                            absl::Duration timeout);
  // OnEveryAsync in two halves, for calls sent before the last ones answered (pipelined
  // training calls): Start begins them and returns at once; Finish waits for them and judges
  // them as OnEveryAsync does. Every InFlight must be Finished, cancelled (Stop) or not.
  struct InFlight {
    std::string what;
    absl::Status refused;  // not started: cancelled or a worker lost before
    std::unique_ptr<ParallelCalls::Started> calls;
  };
  InFlight Start(const std::string& what, const AsyncCall& start, absl::Duration timeout);
  absl::Status Finish(InFlight in_flight);
  // Cancels these calls only (a job's other calls go on); Finish still waits for them.
  static void Stop(InFlight& in_flight);

  // Stops the calls under way (each worker stops before its next batch) and every later one.
  void Cancel();
  // From any thread: the registry holds `name` LOST (`why`). The calls under way are cancelled
  // (a silent worker would hold them until gRPC's keepalive gives up, ~15 s) and they, and
  // every later call, answer UNAVAILABLE naming it. Idempotent; unknown names are ignored.
  void MarkLost(const std::string& name, const std::string& why);
  bool cancelled() const { return cancelled_; }

  // Tears the job down on every worker, bounded by kTeardownTimeout, cancelled or not: a
  // stopped or unreachable worker does not hold the others (or the job's outcome) hostage.
  void Teardown();

  // Workers a call could not reach (UNAVAILABLE) or marked lost: likely dead, not to be placed
  // blindly again.
  std::vector<std::string> unreachable() const;
  // After Teardown: the unreachable workers and those whose teardown failed (stopped, hung).
  std::vector<std::string> lost() const;

 private:
  // The calls' outcome: OK, or the root cause naming its worker.
  absl::Status Judge(const std::string& what, const std::vector<grpc::Status>& results);
  void NoteUnreachable(const std::vector<grpc::Status>& results);
  std::vector<std::string> Names(const std::set<int>& workers) const;
  // The first worker marked lost, as Judge reports it; OK when none is.
  absl::Status LostStatus(const std::string& what) const;
  // The workers marked lost.
  std::set<int> Lost() const;

  const std::string job_id_;
  const std::vector<v1::WorkerInfo> workers_;
  std::vector<std::unique_ptr<v1::Worker::Stub>> stubs_;
  std::vector<std::vector<int>> ranks_of_worker_;
  ParallelCalls calls_;
  std::atomic<bool> cancelled_{false};
  std::set<int> unreachable_;
  std::set<int> teardown_failed_;
  mutable absl::Mutex lost_mu_;  // MarkLost comes from the coordinator's monitor thread
  std::map<int, std::string> lost_ ABSL_GUARDED_BY(lost_mu_);  // worker -> why
};

}  // namespace dtrain
