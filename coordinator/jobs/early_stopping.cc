#include "coordinator/jobs/early_stopping.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace dtrain {

absl::Status EarlyStopping::OnValidationEnd(TrainerControl& trainer,
                                            const ValidationMetrics& metrics) {
  const v1::EarlyStoppingConfig& e = config_;
  // Only fit stops early (Lightning's EarlyStopping skips trainer.validate).
  if (e.monitor().empty() || trainer.state().stage != "fit") return absl::OkStatus();
  DTRAIN_RETURN_IF_ERROR(MonitoredValue(metrics, e.monitor(), "early_stopping").status());
  const int world = trainer.world_size();
  ranks_.resize(world);
  std::vector<bool> rank_stops(world, false);
  for (int r = 0; r < world && r < static_cast<int>(metrics.by_rank.size()); ++r) {
    auto it = metrics.by_rank[r].find(e.monitor());
    if (it == metrics.by_rank[r].end()) continue;  // a rank without validation data has no say
    RankState& s = ranks_[r];
    const bool improved = !s.has_best || (e.mode() == "max" ? it->second > s.best + e.min_delta()
                                                            : it->second < s.best - e.min_delta());
    if (improved) {
      s.best = it->second;
      s.has_best = true;
      s.wait = 0;
    } else {
      ++s.wait;
    }
    rank_stops[r] = s.wait >= e.patience();
  }
  DTRAIN_ASSIGN_OR_RETURN(const bool any, trainer.AnyRankDecides(rank_stops));
  if (any) {
    trainer.Log(absl::StrCat("early stopping: ", e.monitor(), " did not improve by ", e.min_delta(),
                             " for ", e.patience(), " validations"));
    trainer.RequestStop();
  }
  return absl::OkStatus();
}

}  // namespace dtrain
