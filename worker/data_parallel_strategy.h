// dp (Lightning's DataParallelStrategy): one process; the batch is split across the worker's
// devices, each part runs through a replica of the model, the outputs are gathered, and
// *_step_end reduces them as a mean.
//
// On CUDA, replica i runs on cuda:i (PlanDevices, worker/device_plan.h): a ModuleReplica whose
// parameters are differentiable copies of the model's on cuda:0, so gradients come home, as
// torch.nn.DataParallel's replicate. On CPU every "device" is the same CPU, so the replicas are
// the one model (sharing its parameters, as torch's replicas share their source's) and the
// parts run one after another: the semantics of dp (a per-replica loss, then their mean)
// without a speedup, since libtorch's intra-op threads already use every core.
#pragma once

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "worker/module_replica.h"
#include "worker/strategy.h"

namespace dtrain {

class DataParallelStrategy : public Strategy {
 public:
  static absl::StatusOr<std::unique_ptr<Strategy>> Make(const StrategyOptions& options,
                                                        std::unique_ptr<CollectiveBackend> backend);

  std::string name() const override { return "dp"; }
  // A 1-D tensor: one loss per replica.
  absl::StatusOr<torch::Tensor> TrainingStep(const c10::IValue& batch, int64_t idx) override;
  // Scalar outputs become one value per replica; other outputs are concatenated along dim 0.
  absl::StatusOr<StepOutput> EvalStep(StepKind kind, const c10::IValue& batch,
                                      int64_t idx) override;
  torch::Tensor TrainingStepEnd(torch::Tensor output) override;
  StepOutput EvalStepEnd(StepOutput output) override;

 private:
  using Strategy::Strategy;
  // Whether some replica is on another device than the model (CUDA).
  bool replicated() const;
  // The module replica i runs: the model itself for replica 0 and on the CPU; else its
  // ModuleReplica, bound to the model's current parameters.
  absl::StatusOr<LightningModule*> Replica(int i);
  c10::IValue ToReplica(const c10::IValue& part, int i) const;

  std::set<std::string> per_replica_keys_;                // outputs EvalStepEnd averages
  std::vector<std::unique_ptr<ModuleReplica>> replicas_;  // [0] unused: the model
};

}  // namespace dtrain
