// dtrain's collectives as TorchScript custom operators, so that model code reaches them from its
// steps and hooks as a LightningModule reaches its strategy's (self.all_gather,
// self.log(..., sync_dist=True), trainer.strategy.barrier()):
//
//   torch.ops.dtrain.all_gather(Tensor tensor, bool sync_grads=False) -> Tensor  (world, *shape)
//   torch.ops.dtrain.all_reduce(Tensor tensor, str op="sum") -> Tensor     sum|mean|max|min|product
//   torch.ops.dtrain.broadcast(Tensor tensor, int src=0) -> Tensor
//   torch.ops.dtrain.barrier(str name="") -> ()
//   torch.ops.dtrain.reduce_boolean_decision(bool decision, bool all=True) -> bool
//   torch.ops.dtrain.log(str name, Tensor value, bool sync_dist=False, str reduce_fx="mean",
//                        bool? on_step=None, bool? on_epoch=None, int? batch_size=None,
//                        bool prog_bar=False) -> ()      what export()'s self.log calls
//   torch.ops.dtrain.global_rank() -> int,  torch.ops.dtrain.world_size() -> int
//
// The operators run on whatever ModelCollectives the calling thread has in scope (the worker sets
// its job's strategy while it runs model code); with none, they behave as a world of one, which
// is what Python sees at export time (python/dtrain/ops.py defines the same schemas). Every
// operator is registered with conservative alias analysis: TorchScript must neither drop a
// barrier that returns nothing nor merge two identical all_gathers, since every rank has to
// issue the same collectives in the same order.
//
// This file depends on libtorch and absl only: it is compiled into the worker and, from the same
// object, into libdtrain_ops.so for any other process that wants the operators.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"

namespace dtrain {

// Lightning's self.log options that travel with a logged value. Unset on_step / on_epoch take
// the stage's defaults where the worker knows the stage (LoggedValue in worker.proto).
struct LogCallOptions {
  bool sync_dist = false;
  std::string reduce_fx = "mean";  // mean, sum, max or min (validated by the operator)
  std::optional<bool> on_step;
  std::optional<bool> on_epoch;
  std::optional<int64_t> batch_size;  // > 0; unset: the batch's size
  bool prog_bar = false;
};

// What the operators run on. Methods are called on the thread that runs the model code
// (backward's included); a failure's status is what the operator raises, with its message.
class ModelCollectives {
 public:
  virtual ~ModelCollectives() = default;
  virtual int64_t global_rank() const = 0;
  virtual int64_t world_size() const = 0;
  // Every rank's `tensor` (same shape on every rank), stacked along a new dimension 0.
  virtual absl::StatusOr<at::Tensor> AllGather(const at::Tensor& tensor) = 0;
  // In place. `op` is already validated: sum, mean, max, min or product.
  virtual absl::Status AllReduce(at::Tensor& tensor, const std::string& op) = 0;
  virtual absl::Status Broadcast(at::Tensor& tensor, int64_t src) = 0;
  virtual absl::Status Barrier(const std::string& name) = 0;
  virtual absl::StatusOr<bool> ReduceBooleanDecision(bool decision, bool all) = 0;
  // A logged value (one element); with sync_dist it is first reduced over the ranks with
  // `reduce_fx` (mean, sum, max or min), as Lightning's self.log(..., sync_dist=True).
  virtual absl::Status Log(const std::string& name, const at::Tensor& value,
                           const LogCallOptions& options) = 0;
};

// Makes `target` the calling thread's ModelCollectives for the guard's lifetime (nestable).
class ScopedModelCollectives {
 public:
  explicit ScopedModelCollectives(ModelCollectives* target);
  ~ScopedModelCollectives();
  ScopedModelCollectives(const ScopedModelCollectives&) = delete;
  ScopedModelCollectives& operator=(const ScopedModelCollectives&) = delete;

 private:
  ModelCollectives* previous_;
};

// INVALID_ARGUMENT unless `op` names a reduction all_reduce accepts.
absl::Status ValidateReduceOp(const std::string& op);

}  // namespace dtrain
