// libFuzzer target: configure_optimizers' record as a model file carries it (JSON that
// dtrain.export writes, optimization.proto's OptimizationRecipe) and a worker reads it before a
// job trains: the bytes through ChooseOptimizer (worker/runtime/optimizer_choice.h), then, when
// accepted, the optimizer built over a small model's named parameters (MakeOptimizer), the
// recipe's schedulers built (LrSchedulers::Make, a LambdaLR's method answering 0.5), stepped
// over two epochs of three batches, stepped on a plateau and their state saved. A crash, a
// sanitizer report, an exception that escapes, or an INTERNAL or UNKNOWN error is a finding; a
// rate the recipe's own numbers make infinite is not (the job would train with it, as torch
// would). Built and run by tests/fuzz/run.sh --torch, and for a few seconds in every CI run.
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include "dtrain/v1/jobs.pb.h"
#include "tests/fuzz/refused.h"
#include "worker/model/lr_schedulers.h"
#include "worker/model/optimizers.h"
#include "worker/runtime/optimizer_choice.h"

using dtrain::fuzz::Refused;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // A spec that names no optimizer: the model's record decides, as for an exported module.
  static const dtrain::v1::JobSpec* const spec = [] {
    auto* s = new dtrain::v1::JobSpec();
    s->mutable_optimizer()->set_lr(0.1);
    return s;
  }();
  const std::string json(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<dtrain::OptimizerChoice> choice;
  try {
    choice = dtrain::ChooseOptimizer(*spec, json);
  } catch (...) {
    std::abort();
  }
  if (Refused(choice.status()) || !choice->recipe.has_value()) return 0;
  try {
    const std::vector<std::pair<std::string, torch::Tensor>> parameters = {
        {"fc_weight", torch::zeros({3, 4}).requires_grad_(true)},
        {"fc_bias", torch::zeros({3}).requires_grad_(true)}};
    absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> optimizer =
        dtrain::MakeOptimizer(parameters, choice->optimizer);
    if (Refused(optimizer.status())) return 0;
    dtrain::LrLambda lambda = [](const std::string&, int64_t) -> absl::StatusOr<double> {
      return 0.5;
    };
    absl::StatusOr<std::unique_ptr<dtrain::LrSchedulers>> schedulers =
        dtrain::LrSchedulers::Make(choice->recipe->schedulers(), choice->optimizer, lambda);
    if (Refused(schedulers.status())) return 0;
    dtrain::LrSchedulers& s = **schedulers;
    for (int64_t epoch = 0; epoch < 2; ++epoch) {
      for (int64_t batch = 0; batch < 3; ++batch) {
        if (Refused(s.AfterOptimizerStep(batch, /*closes_epoch=*/batch == 2, epoch))) return 0;
      }
      std::map<std::string, double> monitored;
      for (const dtrain::LrSchedulers::Monitor& m : s.PlateauMonitors()) monitored[m.name] = 0.25;
      if (Refused(s.StepPlateaus(epoch, monitored))) return 0;
    }
    (void)s.Rates();
    (void)s.StateDicts();
    (void)s.Describe();
  } catch (...) {
    // The worker guards libtorch's calls, not these: an exception here would end the job's
    // process.
    std::abort();
  }
  return 0;
}
