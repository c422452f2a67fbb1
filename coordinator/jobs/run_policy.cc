#include "coordinator/jobs/run_policy.h"

#include "common/grpc_status.h"

namespace dtrain {
bool MayRunAgain(const RunEnding& ending) {
  if (ending.status.ok() || ending.cancel_requested) return false;
  if (ending.drained) return true;
  return ending.min_nodes < ending.num_nodes && ending.restarts < ending.max_restarts &&
         IsLostPeerError(ending.status);
}

RunDecision DecideNextRun(const RunEnding& ending, int lost_workers, int available_workers) {
  if (!MayRunAgain(ending)) return {NextRun::kEnd, false};
  // Every worker is fine: the failure is the job's own and would recur.
  if (lost_workers == 0) return {NextRun::kEnd, false};
  if (available_workers < ending.min_nodes) {
    return {ending.drained ? NextRun::kRequeue : NextRun::kFail, false};
  }
  return {NextRun::kReform, !ending.drained};
}

Outcome OutcomeOf(const absl::Status& status, bool cancel_requested) {
  if (status.ok()) return {v1::SUCCEEDED, ""};
  if (cancel_requested) return {v1::CANCELLED, "cancelled by request"};
  return {v1::FAILED, std::string(status.message())};
}

}  // namespace dtrain
