#include "coordinator/jobs/logged_metrics.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace dtrain {

std::string StepKey(const std::string& name, const LoggedValue& value) {
  return value.on_epoch ? absl::StrCat(name, "_step") : name;
}

std::string EpochKey(const std::string& name, const LoggedValue& value) {
  return value.on_step ? absl::StrCat(name, "_epoch") : name;
}

void NoteProgressBar(const BatchScalars& batch, std::set<std::string>* names) {
  for (const auto& [name, value] : batch.logged) {
    if (!value.prog_bar) continue;
    if (value.on_step) names->insert(StepKey(name, value));
    if (value.on_epoch) names->insert(EpochKey(name, value));
  }
}

void LoggedAggregates::Add(const std::string& name, const LoggedValue& value) {
  if (!value.on_epoch) return;
  // Every rank's own value: the aggregate is what one process would compute over all the
  // epoch's samples, with or without sync_dist (a step value with sync_dist is already a
  // reduction over the ranks, and would count the others twice).
  const double v = value.local_value;
  auto [it, fresh] = sums_.try_emplace(EpochKey(name, value));
  Sum& sum = it->second;
  if (fresh) {
    sum.reduce_fx = value.reduce_fx;
    sum.max = sum.min = v;
  }
  sum.weighted += v * value.weight;
  sum.weight += value.weight;
  sum.total += v;
  sum.count += 1;
  sum.max = std::max(sum.max, v);
  sum.min = std::min(sum.min, v);
}

std::map<std::string, double> LoggedAggregates::Take() {
  std::map<std::string, double> out;
  for (const auto& [key, sum] : sums_) {
    if (sum.reduce_fx == "sum") {
      out[key] = sum.total;
    } else if (sum.reduce_fx == "max") {
      out[key] = sum.max;
    } else if (sum.reduce_fx == "min") {
      out[key] = sum.min;
    } else {
      out[key] = sum.weight > 0 ? sum.weighted / sum.weight : sum.total / sum.count;
    }
  }
  sums_.clear();
  return out;
}

}  // namespace dtrain
