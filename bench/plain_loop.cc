#include "bench/plain_loop.h"

#include <c10/core/alignment.h>

#include "absl/time/clock.h"
#include "worker/model/model_thread_scope.h"
#include "worker/model/model_zoo.h"
#include "worker/model/optimizers.h"
#include "worker/runtime/compute_threads.h"
#include "worker/runtime/cpu_affinity.h"
#include "worker/runtime/worker_allocator.h"
#include "worker/strategies/elementwise_optimizer.h"

namespace dtrain::bench {

absl::Status PrepareTrainingThread(int threads, const std::string& cpus) {
  // A loop on another allocator would measure the allocator, not the computation it bounds.
  if (absl::StatusOr<std::string> allocator = DescribeWorkerAllocator(); !allocator.ok()) {
    return allocator.status();
  }
  SetComputeThreads(threads);
  if (cpus.empty()) return absl::OkStatus();
  absl::StatusOr<std::vector<int>> checked = CheckCpuList(cpus);
  if (!checked.ok()) return checked.status();
  return PinCurrentThread(*checked);
}

absl::StatusOr<PlainLoop> PlainLoop::Make(const std::string& model, double lr, double momentum,
                                          bool nesterov, int64_t cosine_steps, uint64_t seed) {
  absl::StatusOr<LightningModule> module = BuiltinModel(model, seed);
  if (!module.ok()) return module.status();
  auto optimizer = MakeOptimizer(
      module->Parameters(), {.name = "sgd", .lr = lr, .momentum = momentum, .nesterov = nesterov});
  if (!optimizer.ok()) return optimizer.status();
  SchedulerConfig cosine;
  if (cosine_steps > 0) {
    cosine.name = "cosine";
    cosine.total_steps = cosine_steps;
    cosine.min_lr = 0;
  } else {
    cosine.name = "none";
  }
  absl::StatusOr<LrSchedule> schedule = LrSchedule::Make(cosine, lr);
  if (!schedule.ok()) return schedule.status();
  module->Train(true);
  return PlainLoop(*std::move(module), *std::move(optimizer), *std::move(schedule));
}

absl::Status PlainLoop::Step(const Dataset& data, const std::vector<int64_t>& indices,
                             int64_t batch_idx) {
  if (absl::Status computed = Gradients(data, indices, batch_idx); !computed.ok()) return computed;
  Update(batch_idx);
  return absl::OkStatus();
}

absl::Status PlainLoop::Gradients(const Dataset& data, const std::vector<int64_t>& indices,
                                  int64_t batch_idx) {
  // As a worker's step runs its model code (worker/model/model_thread_scope.h).
  const ModelThreadScope scope(torch::kCPU);
  absl::Time mark = absl::Now();
  auto phase_ends = [&mark](absl::Duration& phase) {
    const absl::Time now = absl::Now();
    phase += now - mark;
    mark = now;
  };
  absl::StatusOr<c10::IValue> batch = data.Batch("train", indices);
  if (!batch.ok()) return batch.status();
  phase_ends(phases_.data);
  // zero_grad(set_to_none=True), torch's default since 2.0 and what a dtrain step does
  // (Strategy::OptimizerZeroGrad): backward then hands over new gradients, adding to nothing.
  for (torch::Tensor& p : parameters_) p.mutable_grad().reset();
  absl::StatusOr<torch::Tensor> loss = model_.TrainingStep(*batch, batch_idx);
  if (!loss.ok()) return loss.status();
  phase_ends(phases_.forward);
  {
    const GradientLanding::Scope lending(landing_.get());
    loss->backward();
  }
  phase_ends(phases_.backward);
  return absl::OkStatus();
}

void PlainLoop::LandGradientsInPlaces() {
  const int64_t line = static_cast<int64_t>(c10::gAlignment / sizeof(float));
  int64_t total = 0;
  for (const torch::Tensor& p : parameters_) total += (p.numel() + line - 1) / line * line;
  const torch::Tensor buffer = torch::zeros({total});
  std::vector<torch::Tensor> places;
  int64_t offset = 0;
  for (const torch::Tensor& p : parameters_) {
    places.push_back(buffer.slice(0, offset, offset + p.numel()).view(p.sizes()));
    offset += (p.numel() + line - 1) / line * line;
  }
  LandGradientsIn(std::make_unique<GradientLanding>(std::move(places)));
}

void PlainLoop::Update(int64_t step) {
  const ModelThreadScope scope(torch::kCPU);
  const absl::Time began = absl::Now();
  schedule_.Apply(*optimizer_, step);
  optimizer_->step();
  phases_.update += absl::Now() - began;
}

void PlainLoop::UpdatePart(int64_t step, torch::optim::Optimizer& part) {
  const ModelThreadScope scope(torch::kCPU);
  const absl::Time began = absl::Now();
  schedule_.Apply(*optimizer_, step);
  ElementwiseOptimizer::Of(*optimizer_)
      ->CopyOptions(optimizer_->param_groups()[0].options(), part.param_groups()[0].options());
  part.step();
  phases_.update += absl::Now() - began;
}

}  // namespace dtrain::bench
