// The job's strategy as the target of torch.ops.dtrain.* (worker/collectives/collective_ops.h):
// model code's collectives run on the job's collective plane, after the gradient buckets already in
// flight (a collective from model code during backward must not race ddp's bucket all_reduces:
// every rank issues them in the same order), and their failures keep their status (code and named
// ranks) instead of becoming the model's INVALID_ARGUMENT.
//
// Thread-safety: the thread that runs the model code.
#pragma once

#include <map>
#include <string>

#include "worker/collectives/collective_ops.h"
#include "worker/strategies/strategy.h"

namespace dtrain {

class StrategyCollectives : public ModelCollectives {
 public:
  explicit StrategyCollectives(Strategy* strategy) : strategy_(strategy) {}

  int64_t global_rank() const override { return strategy_->global_rank(); }
  int64_t world_size() const override { return strategy_->world_size(); }
  absl::StatusOr<at::Tensor> AllGather(const at::Tensor& tensor) override;
  absl::Status AllReduce(at::Tensor& tensor, const std::string& op) override;
  absl::Status Broadcast(at::Tensor& tensor, int64_t src) override;
  absl::Status Barrier(const std::string& name) override;
  absl::StatusOr<bool> ReduceBooleanDecision(bool decision, bool all) override;
  absl::Status Log(const std::string& name, const at::Tensor& value,
                   const LogCallOptions& options) override;

  // A logged value (already reduced over the ranks when sync_dist) with its options.
  struct Logged {
    double value = 0;        // reduced over the ranks when sync_dist
    double local_value = 0;  // this rank's
    LogCallOptions options;
  };
  // The values logged since the last take, by name (the last value of a name wins, as a step's
  // self.log does), then forgets them.
  std::map<std::string, Logged> TakeLogged();
  // After model code failed with `error`: the failed collective's status if one failed during
  // the call (its code, its message naming the ranks, and where the model raised it), else
  // `error` as it is. Forgets the failure.
  absl::Status Explain(absl::Status error);

 private:
  absl::Status Record(absl::Status status);

  Strategy* const strategy_;
  std::map<std::string, Logged> logged_;
  absl::Status failure_;
};

}  // namespace dtrain
