#include "coordinator/jobs/monitored_metric.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/jobs/batch_limits.h"

namespace dtrain {

absl::StatusOr<double> MonitoredValue(const std::map<std::string, double>& values,
                                      const std::string& monitor, const std::string& section) {
  auto it = values.find(monitor);
  if (it != values.end()) return it->second;
  std::vector<std::string> have;
  for (const auto& [name, value] : values) have.push_back(name);
  return absl::FailedPreconditionError(
      absl::StrCat(section, ".monitor: '", monitor,
                   "' is neither a validation metric nor a training epoch value the model logs; "
                   "the run has ",
                   have.empty() ? "none" : absl::StrJoin(have, ", ")));
}

bool ValidationOff(TrainerControl& trainer) {
  const v1::TrainerConfig& t = trainer.spec().trainer();
  return BatchLoopOff(t, BatchLoop::kVal) || trainer.state().split_size("val") == 0;
}

}  // namespace dtrain
