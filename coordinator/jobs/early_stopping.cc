#include "coordinator/jobs/early_stopping.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "coordinator/jobs/monitored_metric.h"

namespace dtrain {

absl::Status EarlyStopping::OnTrainBatchesEnd(TrainerControl& trainer,
                                              const TrainBatches& batches) {
  for (const auto& [name, value] : batches.epoch_logged) train_values_[name] = value;
  if (!batches.epoch_end || config_.monitor().empty() || trainer.state().stage != "fit" ||
      !ValidationOff(trainer)) {
    return absl::OkStatus();
  }
  DTRAIN_ASSIGN_OR_RETURN(const double value,
                          MonitoredValue(train_values_, config_.monitor(), "early_stopping"));
  return Judge(trainer, std::vector<std::map<std::string, double>>(trainer.world_size(),
                                                                   {{config_.monitor(), value}}));
}

absl::Status EarlyStopping::OnValidationEnd(TrainerControl& trainer,
                                            const ValidationMetrics& metrics) {
  const v1::EarlyStoppingConfig& e = config_;
  // Only fit stops early (Lightning's EarlyStopping skips trainer.validate).
  if (e.monitor().empty() || trainer.state().stage != "fit") return absl::OkStatus();
  if (metrics.overall.count(e.monitor()) > 0) return Judge(trainer, metrics.by_rank);
  std::map<std::string, double> values = metrics.overall;
  values.insert(train_values_.begin(), train_values_.end());
  DTRAIN_ASSIGN_OR_RETURN(const double value,
                          MonitoredValue(values, e.monitor(), "early_stopping"));
  return Judge(trainer, std::vector<std::map<std::string, double>>(trainer.world_size(),
                                                                   {{e.monitor(), value}}));
}

absl::Status EarlyStopping::Judge(TrainerControl& trainer,
                                  const std::vector<std::map<std::string, double>>& by_rank) {
  const v1::EarlyStoppingConfig& e = config_;
  const int world = trainer.world_size();
  if (static_cast<int>(ranks_.size()) != world) ranks_.resize(world, restored_);
  std::vector<bool> rank_stops(world, false);
  std::string why;  // the first stopping rank's reason, for the log
  const bool max = e.mode() == "max";
  for (int r = 0; r < world && r < static_cast<int>(by_rank.size()); ++r) {
    auto it = by_rank[r].find(e.monitor());
    if (it == by_rank[r].end()) continue;  // a rank without validation data has no say
    const double value = it->second;
    RankState& s = ranks_[r];
    // Lightning's order: a non-finite value, the stopping threshold, the divergence threshold,
    // then patience.
    std::string reason;
    if ((!e.has_check_finite() || e.check_finite()) && !std::isfinite(value)) {
      reason = absl::StrCat(e.monitor(), " is ", value, ", not a finite number");
    } else if (e.has_stopping_threshold() &&
               (max ? value >= e.stopping_threshold() : value <= e.stopping_threshold())) {
      reason = absl::StrCat(e.monitor(), " = ", value, " reached the stopping threshold ",
                            e.stopping_threshold());
    } else if (e.has_divergence_threshold() &&
               (max ? value < e.divergence_threshold() : value > e.divergence_threshold())) {
      reason = absl::StrCat(e.monitor(), " = ", value, " is worse than the divergence threshold ",
                            e.divergence_threshold());
    }
    const bool improved =
        !s.has_best || (max ? value > s.best + e.min_delta() : value < s.best - e.min_delta());
    if (improved && std::isfinite(value)) {
      s.best = value;
      s.has_best = true;
      s.wait = 0;
    } else {
      ++s.wait;
    }
    if (reason.empty() && s.wait >= e.patience()) {
      reason = absl::StrCat(e.monitor(), " did not improve by ", e.min_delta(), " for ",
                            e.patience(), " validations");
    }
    rank_stops[r] = !reason.empty();
    if (why.empty() && !reason.empty()) why = absl::StrCat(reason, " (rank ", r, ")");
  }
  DTRAIN_ASSIGN_OR_RETURN(const bool any, trainer.AnyRankDecides(rank_stops));
  if (any) {
    trainer.Log(absl::StrCat("early stopping: ", why));
    stopped_epoch_ = trainer.state().epoch;
    trainer.RequestStop();
  }
  return absl::OkStatus();
}

namespace {

std::string StateKey(const v1::EarlyStoppingConfig& e) {
  return absl::StrCat("EarlyStopping{'monitor': '", e.monitor(), "', 'mode': '", e.mode(), "'}");
}

}  // namespace

std::optional<v1::CallbackState> EarlyStopping::StateDict() const {
  if (config_.monitor().empty()) return std::nullopt;
  const bool max = config_.mode() == "max";
  const RankState s = ranks_.empty() ? restored_ : ranks_.front();
  v1::CallbackState state;
  state.set_key(StateKey(config_));
  (*state.mutable_ints())["wait_count"] = s.wait;
  (*state.mutable_ints())["stopped_epoch"] = stopped_epoch_;
  (*state.mutable_ints())["patience"] = config_.patience();
  (*state.mutable_tensors())["best_score"] = s.has_best
                                                 ? s.best
                                                 : (max ? -std::numeric_limits<double>::infinity()
                                                        : std::numeric_limits<double>::infinity());
  return state;
}

void EarlyStopping::LoadStateDict(const std::vector<v1::CallbackState>& states) {
  for (const v1::CallbackState& state : states) {
    if (state.key() != StateKey(config_)) continue;
    auto wait = state.ints().find("wait_count");
    auto stopped = state.ints().find("stopped_epoch");
    std::optional<double> best;
    if (auto t = state.tensors().find("best_score"); t != state.tensors().end()) best = t->second;
    if (auto f = state.floats().find("best_score"); f != state.floats().end()) best = f->second;
    if (wait != state.ints().end()) restored_.wait = static_cast<int>(wait->second);
    if (best.has_value() && std::isfinite(*best)) {
      restored_.best = *best;
      restored_.has_best = true;
    }
    if (stopped != state.ints().end()) stopped_epoch_ = stopped->second;
    ranks_.assign(ranks_.size(), restored_);
  }
}

}  // namespace dtrain
