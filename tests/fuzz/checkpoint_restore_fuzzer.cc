// libFuzzer target: bytes as a checkpoint restored into a job (RestoreCheckpoint,
// worker/checkpoint/checkpoint.h): the torch.save reader, then Lightning's layout (state_dict,
// optimizer_states, loops, the loss scaler's state) applied to a small model, its optimizer
// and a loss scaler, then the checkpoint's lr_schedulers loaded into configure_optimizers'
// schedulers (LrSchedulers::Load) and stepped once. The input's first byte picks the optimizer
// (bit 0: SGD with momentum or Adam) and the scheduler (bits 1-2: StepLR, OneCycleLR,
// ReduceLROnPlateau or CosineAnnealingWarmRestarts), so that every kind of state is read; the
// rest is the file. A crash, a sanitizer report, an uncaught exception, an INTERNAL or UNKNOWN
// error, or a restore that succeeds with parameters of another shape is a finding; a step after
// it runs as a job's would (libtorch's errors are the step's errors there). Seeds in
// tests/fuzz/corpus/checkpoint_restore/ (tests/fuzz/make_torch_corpus.py). Built and run by
// tests/fuzz/run.sh, and for a few seconds in every CI run (checkpoint_restore_fuzz_check).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include <torch/optim/optimizer.h>
#include <torch/script.h>
#include <torch/utils.h>

#include "tests/fuzz/refused.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/model/lightning_module.h"
#include "worker/model/lr_schedulers.h"
#include "worker/model/optimizers.h"
#include "worker/precision/precision.h"

namespace {

// A linear model of 4 inputs and 3 classes: parameters fc_weight [3, 4] and fc_bias [3].
std::unique_ptr<dtrain::LightningModule> TinyModel() {
  torch::jit::Module m("tiny");
  m.register_parameter("fc_weight", torch::zeros({3, 4}).requires_grad_(true), false);
  m.register_parameter("fc_bias", torch::zeros({3}).requires_grad_(true), false);
  m.define(R"(
def forward(self, x: Tensor) -> Tensor:
    return torch.linear(x, self.fc_weight, self.fc_bias)

def training_step(self, batch: Tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
    x, y = batch
    return torch.nll_loss(torch.log_softmax(self.forward(x), 1), y)
)");
  absl::StatusOr<dtrain::LightningModule> wrapped = dtrain::LightningModule::Wrap(m, "tiny");
  if (!wrapped.ok()) std::abort();
  return std::make_unique<dtrain::LightningModule>(std::move(*wrapped));
}

// The scheduler configure_optimizers would have built, as the first byte's bits 1-2 pick it.
google::protobuf::RepeatedPtrField<dtrain::v1::SchedulerRecipe> Schedulers(uint8_t pick) {
  google::protobuf::RepeatedPtrField<dtrain::v1::SchedulerRecipe> recipes;
  dtrain::v1::SchedulerRecipe* r = recipes.Add();
  switch ((pick >> 1) % 4) {
    case 0:
      r->set_kind("StepLR");
      r->set_step_size(2);
      r->set_gamma(0.5);
      break;
    case 1:
      // torch's defaults, as export() writes them out.
      r->set_kind("OneCycleLR");
      r->add_max_lr(0.5);
      r->set_total_steps(100);
      r->set_interval("step");
      r->set_pct_start(0.3);
      r->set_anneal_strategy("cos");
      r->set_cycle_momentum(true);
      r->add_base_momentum(0.85);
      r->add_max_momentum(0.95);
      r->set_div_factor(25);
      r->set_final_div_factor(1e4);
      break;
    case 2:
      r->set_kind("ReduceLROnPlateau");
      r->set_monitor("val_loss");
      r->set_strict(true);
      r->set_factor(0.5);
      r->set_mode("min");
      r->set_patience(10);
      r->set_threshold(1e-4);
      r->set_threshold_mode("rel");
      r->add_min_lr(0);
      r->set_eps(1e-8);
      break;
    default:
      r->set_kind("CosineAnnealingWarmRestarts");
      r->set_t_0(3);
      r->set_t_mult(2);
      break;
  }
  return recipes;
}

}  // namespace

using dtrain::fuzz::Refused;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::unique_ptr<dtrain::LightningModule> model = TinyModel();
  dtrain::OptimizerConfig config;
  config.name = data[0] % 2 == 0 ? "sgd" : "adam";
  config.momentum = 0.9;
  absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> optimizer =
      dtrain::MakeOptimizer(model->Parameters(), config);
  if (!optimizer.ok()) std::abort();
  dtrain::LossScaler scaler;
  const std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  absl::StatusOr<dtrain::TrainingProgress> restored =
      dtrain::RestoreCheckpoint(bytes, "fuzz.ckpt", *model, optimizer->get(), &scaler);
  if (Refused(restored.status())) return 0;
  const std::vector<torch::Tensor> parameters = model->Parameters();
  if (parameters.size() != 2 || parameters[0].sizes() != torch::IntArrayRef({3, 4}) ||
      parameters[1].sizes() != torch::IntArrayRef({3})) {
    std::abort();
  }
  // The schedulers' state, as Accelerator::Restore loads it, then a step of each kind.
  if (!restored->lr_schedulers.empty()) {
    absl::StatusOr<std::unique_ptr<dtrain::LrSchedulers>> schedulers =
        dtrain::LrSchedulers::Make(Schedulers(data[0]), config, {});
    if (!schedulers.ok()) {
      std::fprintf(stderr, "%s\n", std::string(schedulers.status().message()).c_str());
      std::abort();
    }
    if (!Refused((*schedulers)->Load(restored->lr_schedulers, restored->group_rates))) {
      (void)Refused((*schedulers)->AfterOptimizerStep(0, /*closes_epoch=*/true, 0));
      (void)Refused((*schedulers)->StepPlateaus(0, {{"val_loss", 0.25}}));
    }
  }
  // A step with what was restored, reading every piece of optimizer state.
  try {
    absl::StatusOr<torch::Tensor> loss = model->TrainingStep(
        c10::ivalue::Tuple::create({torch::ones({2, 4}), torch::zeros({2}, torch::kLong)}), 0);
    if (loss.ok()) {
      loss->backward();
      (*optimizer)->step();
    }
  } catch (const c10::Error&) {
    // A job's step turns it into the step's error (worker/runtime/accelerator.cc).
  }
  return 0;
}
