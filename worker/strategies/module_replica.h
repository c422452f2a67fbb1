// A dp replica of a model on another device, as torch.nn.DataParallel's replicate: the
// replica's parameters are differentiable copies of the source's, made again before each step
// (Bind), so backward through a replica accumulates the gradients into the source's
// parameters on the root device, and the optimizer steps the source alone. Buffers are copied
// without gradients. Used for CUDA replicas (cuda:i); on the CPU dp runs its parts through the
// source itself.
//
// Thread-safety: one thread at a time.
#pragma once

#include <memory>
#include <string>

#include <torch/script.h>

#include "absl/status/statusor.h"
#include "worker/model/lightning_module.h"

namespace dtrain {

class ModuleReplica {
 public:
  // A structural copy of `source` (which must outlive it) for `device`.
  static absl::StatusOr<std::unique_ptr<ModuleReplica>> Make(LightningModule* source,
                                                             torch::Device device);

  // Copies the source's current parameters (differentiably), buffers and loop state
  // (current_epoch, global_step) to the device.
  absl::Status Bind();

  LightningModule& module() { return replica_; }
  torch::Device device() const { return device_; }

 private:
  ModuleReplica(LightningModule* source, LightningModule replica, torch::Device device)
      : source_(source), replica_(std::move(replica)), device_(device) {}

  LightningModule* source_;
  LightningModule replica_;
  torch::Device device_;
};

}  // namespace dtrain
