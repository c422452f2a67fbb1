// dtrain's checkpoint file, in PyTorch Lightning's layout and Python's torch.save format, so
// that `torch.load(path)` gives a dict a Lightning user already knows:
//   "state_dict"               {name: tensor}: the module's own parameter and buffer names
//   "optimizer_states"         [torch.optim's optimizer.state_dict()] (SGD, Adam, AdamW,
//                              RMSprop, Adagrad; param groups with a scheduler's keys)
//   "lr_schedulers"            [torch.optim.lr_scheduler's state_dict()] (empty without one)
//   "epoch", "global_step"     ints
//   "native_amp_scaling_state" torch.cuda.amp.GradScaler's state_dict() (16-mixed only)
//   "pytorch-lightning_version" the Lightning layout this follows
//   "dtrain"                   {"format_version": 2, "world_size", "strategy", "precision",
//                               "job_spec" (the resolved spec as JSON), "rng_cpu"}
// A checkpoint Python wrote in that layout (a Lightning .ckpt, or a dict made by hand with at
// least "state_dict") loads too; so do dtrain's older libtorch-archive checkpoints (version 1).
// See docs/checkpoints.md. Writes are atomic: a temporary file in the same directory, then
// rename, so a crash never leaves a half-written checkpoint under the final name.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <torch/optim/optimizer.h>

#include "absl/status/statusor.h"
#include "worker/checkpoint/checkpoint_io.h"
#include "worker/model/lightning_module.h"
#include "worker/model/lr_schedulers.h"
#include "worker/model/optimizers.h"
#include "worker/precision/precision.h"

namespace dtrain {

class PluginRegistry;

// A callback's state under a checkpoint's "callbacks" (worker.proto's CallbackState).
struct CallbackStateDict {
  std::string key;
  std::map<std::string, int64_t> ints;
  std::map<std::string, double> floats;
  std::map<std::string, double> tensors;  // 0-dim float32 tensors in the file
};

struct TrainingProgress {
  int64_t global_step = 0;
  int64_t epoch = 0;
  // Read back from a checkpoint, for configure_optimizers' schedulers: "lr_schedulers", and each
  // param group's rates as the file has them.
  std::vector<c10::IValue> lr_schedulers = {};
  ScheduledGroups group_rates = {};
  // The file's "callbacks" entries made of numbers.
  std::vector<CallbackStateDict> callbacks = {};
  // Whether the file held an optimizer's state_dict, restored into the optimizer given: a
  // state_dict saved before the first step has an empty "state", which restores a fresh
  // optimizer, unlike a file without one (weights only), which leaves the optimizer as it was.
  bool optimizer_restored = false;
};

// mkdir -p `dir` and checks that a file can be created in it, so that a job learns at setup,
// not at its first save, that its checkpoints have nowhere to go. FAILED_PRECONDITION naming the
// directory and the system's reason.
absl::Status PrepareCheckpointDirectory(const std::string& dir);

// What a checkpoint records about the run that wrote it.
struct CheckpointMetadata {
  int world_size = 1;
  std::string strategy;
  std::string precision;
  std::string job_spec_json;             // the resolved job spec; "" when not known
  const LrSchedule* schedule = nullptr;  // for "lr_schedulers"; none when null
  // configure_optimizers' schedulers, which take the place of `schedule` when set: their
  // state_dicts, and the keys they add to the param groups (initial_lr, OneCycleLR's).
  const LrSchedulers* schedulers = nullptr;
  std::vector<CallbackStateDict> callbacks;  // "callbacks", the coordinator's states
};

// `optimizer` and `scaler` may be null. Written by `io` (null: TorchCheckpointIO) with
// `storage_options`. INVALID_ARGUMENT when the file cannot be written.
absl::Status SaveCheckpoint(const std::string& path, const LightningModule& model,
                            torch::optim::Optimizer* optimizer, const LossScaler* scaler,
                            const TrainingProgress& progress,
                            const CheckpointMetadata& metadata = {}, CheckpointIO* io = nullptr,
                            const StorageOptions& storage_options = {});

// Restores into existing objects of the same architecture. NOT_FOUND: no file.
// INVALID_ARGUMENT: not a checkpoint, a parameter missing, unexpected or of another shape, or
// optimizer state that does not fit the optimizer (the message names it).
absl::StatusOr<TrainingProgress> LoadCheckpoint(const std::string& path, LightningModule& model,
                                                torch::optim::Optimizer* optimizer,
                                                LossScaler* scaler);

// The two halves of LoadCheckpoint, for a checkpoint read on one rank and broadcast to the
// others: the file's bytes (NOT_FOUND: no file), and a restore from such bytes (`origin`
// names the file in messages).
absl::StatusOr<std::string> ReadCheckpointFile(const std::string& path);
absl::StatusOr<TrainingProgress> RestoreCheckpoint(const std::string& bytes,
                                                   const std::string& origin,
                                                   LightningModule& model,
                                                   torch::optim::Optimizer* optimizer,
                                                   LossScaler* scaler);

// dtrain's own CheckpointIO ("torch"), added to `registry`.
void RegisterBuiltinCheckpointIO(PluginRegistry& registry);

}  // namespace dtrain
