// The plain libtorch training loop the training benches measure dtrain against: a zoo model
// (TorchScript, as a worker loads it) and SGD with momentum, one step being zero_grad (to none),
// the model's training_step on a Dataset::Batch, backward and the optimizer step, with no service
// and no communication around it. One definition, so that the compute ceiling
// (train_loop_bench.cc) and the in-process overhead comparison (step_overhead_bench.cc) run
// exactly the same loop.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/optim/optimizer.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/data/dataset.h"
#include "worker/model/lightning_module.h"
#include "worker/model/optimizers.h"
#include "worker/strategies/gradient_landing.h"

namespace dtrain::bench {

// Checks that the process allocates as a worker does (jemalloc with the worker's options:
// worker/runtime/worker_allocator.h), sets libtorch's compute threads on the calling thread and
// pins it to `cpus` (a --cpus list; empty: not pinned), as a worker does for its step thread.
absl::Status PrepareTrainingThread(int threads, const std::string& cpus);

class PlainLoop {
 public:
  // `model`: a zoo name (mlp, cnn), built with `seed` as a job's is with its seed_everything.
  // `cosine_steps` > 0 anneals lr to 0 over that many optimizer steps, as a job's lr_scheduler
  // cosine does over its run.
  static absl::StatusOr<PlainLoop> Make(const std::string& model, double lr, double momentum,
                                        bool nesterov = false, int64_t cosine_steps = 0,
                                        uint64_t seed = 1);

  // One optimizer step on the training samples `indices` of `data`: Gradients, then Update.
  absl::Status Step(const Dataset& data, const std::vector<int64_t>& indices, int64_t batch_idx);

  // The gradients of the training samples `indices` (zero_grad, training_step, backward), left
  // in the parameters' .grad for the caller to exchange before Update. With a landing (below),
  // backward runs in its scope, as a ddp job's split step runs it
  // (worker/strategies/gradient_landing.h).
  absl::Status Gradients(const Dataset& data, const std::vector<int64_t>& indices,
                         int64_t batch_idx);
  // Optimizer step `step` (from 0: it sets the schedule's lr) from the gradients the parameters
  // hold.
  void Update(int64_t step);
  // Optimizer step `step` of `part` alone: an optimizer of this loop's kind over some of its
  // parameters' elements (worker/strategies/elementwise_optimizer.h), as a rank of a ddp job whose
  // step is split runs it; it takes this loop's options for the step (the schedule's lr).
  void UpdatePart(int64_t step, torch::optim::Optimizer& part);

  // The loop's optimizer (one param group), to build the optimizer of a part from.
  const torch::optim::Optimizer& optimizer() const { return *optimizer_; }

  // The model's parameters, collected once: the step loops read their gradients every step.
  const std::vector<torch::Tensor>& Parameters() const { return parameters_; }
  // From now on Gradients makes the new gradients in `landing`'s places (one per parameter, in
  // order), as a ddp job's split step makes them in its landing buffers: what that saves (the
  // copy, and the heap's fresh pages for a large gradient each step) the loops save too, so that
  // the ceiling stays the job's compute and the lockstep loops its algorithm.
  void LandGradientsIn(std::unique_ptr<GradientLanding> landing) { landing_ = std::move(landing); }
  // Places of the loop's own in ordinary memory that stays mapped, each on 64 bytes.
  void LandGradientsInPlaces();
  GradientLanding* landing() const { return landing_.get(); }

  // Time in each phase since the last ResetPhases, named as the job log's "time per batch by
  // rank" names them, so a loop's batch can be set beside a job's.
  struct Phases {
    absl::Duration data;      // Dataset::Batch
    absl::Duration forward;   // zero_grad and training_step
    absl::Duration backward;  // backward
    absl::Duration update;    // the optimizer's step and the schedule
  };
  const Phases& phases() const { return phases_; }
  void ResetPhases() { phases_ = {}; }

 private:
  PlainLoop(LightningModule model, std::unique_ptr<torch::optim::Optimizer> optimizer,
            LrSchedule schedule)
      : model_(std::move(model)),
        parameters_(model_.Parameters()),
        optimizer_(std::move(optimizer)),
        schedule_(std::move(schedule)) {}
  LightningModule model_;
  std::vector<torch::Tensor> parameters_;
  std::unique_ptr<GradientLanding> landing_;  // LandGradientsIn
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  LrSchedule schedule_;
  Phases phases_;
};

}  // namespace dtrain::bench
