#include "coordinator/jobs/rank_timing.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace dtrain {

absl::Status RankTiming::OnTrainBatchesEnd(TrainerControl& trainer, const TrainBatches& batches) {
  if (batches.result == nullptr) return absl::OkStatus();
  for (const RankTrainResult& rank : batches.result->ranks) {
    auto& [in_steps, waiting] = seconds_[rank.rank];
    in_steps += rank.step_seconds;
    waiting += rank.gradient_wait_seconds;
  }
  return absl::OkStatus();
}

absl::Status RankTiming::OnTrainEnd(TrainerControl& trainer) {
  if (seconds_.empty()) return absl::OkStatus();
  constexpr int kLoggedRanks = 8;
  std::vector<std::string> parts;
  double busiest = 0;
  for (const auto& [rank, seconds] : seconds_) {
    const auto& [in_steps, waiting] = seconds;
    busiest = std::max(busiest, in_steps);
    if (static_cast<int>(parts.size()) < kLoggedRanks) {
      parts.push_back(
          absl::StrFormat("rank %d %.2f s in steps, %.2f s (%.1f%%) of it waiting "
                          "for gradients",
                          rank, in_steps, waiting, in_steps > 0 ? 100 * waiting / in_steps : 0.0));
    }
  }
  if (seconds_.size() > kLoggedRanks) {
    parts.push_back(absl::StrCat("and ", seconds_.size() - kLoggedRanks, " more"));
  }
  const TrainingState& state = trainer.state();
  const double train = absl::ToDoubleSeconds(state.phases.Get("train"));
  trainer.Log(absl::StrFormat(
      "time by rank: %s; between steps (the coordinator) %.2f s of %.2f s in %s",
      absl::StrJoin(parts, "; "), std::max(0.0, train - busiest), train, state.calls.Summary()));
  return absl::OkStatus();
}

}  // namespace dtrain
