// Lightning's self.log semantics on the coordinator, over every rank's batches: the names a
// logged value gets (<name>, or <name>_step and <name>_epoch when it is logged both ways) and
// its epoch aggregate (reduce_fx over the epoch's batches on every rank; a mean weighs each
// value by its batch_size). The values come from the workers (LoggedValue in worker_group.h).
#pragma once

#include <map>
#include <set>
#include <string>

#include "coordinator/jobs/worker_group.h"

namespace dtrain {

// The metric name of a value's per-step points, and of its epoch aggregate.
std::string StepKey(const std::string& name, const LoggedValue& value);
std::string EpochKey(const std::string& name, const LoggedValue& value);

// Adds the names of the batch's values logged with prog_bar=True (both names of a value
// logged both ways) to `names`.
void NoteProgressBar(const BatchScalars& batch, std::set<std::string>* names);

// One epoch's aggregates of the on_epoch values, fed batch by batch from every rank.
class LoggedAggregates {
 public:
  // Values without on_epoch are ignored.
  void Add(const std::string& name, const LoggedValue& value);
  void AddBatch(const BatchScalars& batch) {
    for (const auto& [name, value] : batch.logged) Add(name, value);
  }
  bool empty() const { return sums_.empty(); }
  // Each aggregate by its epoch key; then forgets them (the next epoch starts empty).
  std::map<std::string, double> Take();

 private:
  struct Sum {
    std::string reduce_fx;
    double weighted = 0;  // sum of value * weight
    double weight = 0;
    double total = 0;  // sum of values
    double count = 0;
    double max = 0;
    double min = 0;
  };
  std::map<std::string, Sum> sums_;  // by epoch key
};

}  // namespace dtrain
