// dtrain's checkpoint file: one torch::serialize archive (the format torch::save writes)
// holding, under these keys:
//   "dtrain_checkpoint_version"   int64 tensor, 1
//   "model/<parameter or buffer>" every named parameter and buffer of the module
//   "optimizer"                   the optimizer's own archive (state such as momentum buffers)
//   "global_step", "epoch"        int64 tensors
//   "loss_scale", "scale_growth"  the 16-mixed LossScaler's state (when there is one)
//   "rng_cpu"                     the default CPU generator's state
// See docs/checkpoints.md. Writes are atomic: a temporary file in the same directory, then
// rename, so a crash never leaves a half-written checkpoint under the final name.
#pragma once

#include <cstdint>
#include <string>

#include <torch/optim/optimizer.h>

#include "absl/status/statusor.h"
#include "worker/lightning_module.h"
#include "worker/precision.h"

namespace dtrain {

struct TrainingProgress {
  int64_t global_step = 0;
  int64_t epoch = 0;
};

// mkdir -p `dir` and checks that a file can be created in it, so that a job learns at setup,
// not at its first save, that its checkpoints have nowhere to go. FAILED_PRECONDITION naming the
// directory and the system's reason.
absl::Status PrepareCheckpointDirectory(const std::string& dir);

// `optimizer` and `scaler` may be null. INVALID_ARGUMENT when the file cannot be written.
absl::Status SaveCheckpoint(const std::string& path, const LightningModule& model,
                            torch::optim::Optimizer* optimizer, const LossScaler* scaler,
                            const TrainingProgress& progress);

// Restores into existing objects of the same architecture. NOT_FOUND: no file.
// INVALID_ARGUMENT: not a dtrain checkpoint, or a parameter missing or of another shape (the
// message names it).
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

}  // namespace dtrain
