// dp (Lightning's DataParallelStrategy): one process; the batch is split across the worker's
// devices, each part runs through a replica of the model, and the replicas' outputs are gathered
// as torch.nn.DataParallel gathers them (one-element tensors stacked into one value per replica,
// others concatenated along dimension 0, per key of a dict). Then, as Lightning: the module's own
// training_step_end / validation_step_end / test_step_end receives the gathered output when it
// defines one; otherwise dp's reduce takes the mean of every tensor of it (predict's output stays
// gathered).
//
// On CUDA, replica i runs on cuda:i (PlanDevices, worker/precision/device_plan.h): a ModuleReplica
// whose parameters are differentiable copies of the model's on cuda:0, so gradients come home, as
// torch.nn.DataParallel's replicate. On CPU every "device" is the same CPU, so the replicas are
// the one model (sharing its parameters, as torch's replicas share their source's) and the
// parts run one after another: the semantics of dp (a per-replica loss, then their mean)
// without a speedup, since libtorch's intra-op threads already use every core.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "worker/strategies/module_replica.h"
#include "worker/strategies/strategy.h"

namespace dtrain {

class DataParallelStrategy : public Strategy {
 public:
  static absl::StatusOr<std::unique_ptr<Strategy>> Make(const StrategyOptions& options,
                                                        std::unique_ptr<CollectiveBackend> backend);

  // Lightning's DataParallelStrategy.reduce: every tensor of `collection` (nested dicts, lists,
  // tuples) replaced by its mean, computed in float and cast back to the tensor's dtype; other
  // values pass through.
  static c10::IValue ReduceCollection(const c10::IValue& collection);
  // The replicas' outputs as torch.nn.DataParallel gathers them, on `device`. INVALID_ARGUMENT
  // when they differ in structure.
  static absl::StatusOr<c10::IValue> Gather(const std::vector<c10::IValue>& outputs,
                                            torch::Device device);

  std::string name() const override { return "dp"; }
  // The loss after training_step_end or the reduce.
  absl::StatusOr<torch::Tensor> TrainingStep(const c10::IValue& batch, int64_t idx) override;
  absl::StatusOr<StepOutput> EvalStep(StepKind kind, const c10::IValue& batch,
                                      int64_t idx) override;
  // The tensor's mean (dp has one process: nothing to all-reduce).
  absl::Status Reduce(torch::Tensor& tensor, v1::ReduceOp op) override;

 private:
  using Strategy::Strategy;
  // Whether some replica is on another device than the model (CUDA).
  bool replicated() const;
  // The module replica i runs: the model itself for replica 0 and on the CPU; else its
  // ModuleReplica, bound to the model's current parameters.
  absl::StatusOr<LightningModule*> Replica(int i);
  c10::IValue ToReplica(const c10::IValue& part, int i) const;
  // `method` on every replica's part of `batch`, gathered on the root device.
  absl::StatusOr<c10::IValue> RunReplicas(const std::string& method, const c10::IValue& batch,
                                          int64_t idx);

  std::vector<std::unique_ptr<ModuleReplica>> replicas_;  // [0] unused: the model
};

}  // namespace dtrain
