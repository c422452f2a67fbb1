#include "coordinator/jobs/worker_group.h"

#include "absl/strings/str_cat.h"

namespace dtrain {

absl::Status WorkerLostError(const std::string& what, const std::string& worker,
                             const std::string& why) {
  return absl::UnavailableError(absl::StrCat(
      what, " lost ", worker, " (", why,
      "): it was stopped, its process died or its host became unreachable; see that worker's log"));
}

absl::StatusOr<TrainResult> WorkerGroup::FinishTrain() {
  if (unstarted_.empty()) return absl::InternalError("FinishTrain without a started call");
  const TrainCall call = std::move(unstarted_.front());
  unstarted_.pop_front();
  return Train(call);
}

}  // namespace dtrain
