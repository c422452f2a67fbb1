#include "worker/runtime/optimizer_choice.h"

#include <torch/types.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "google/protobuf/util/json_util.h"

namespace dtrain {
namespace {

// A normalized spec's optimizer and schedule (their defaults are applied).
OptimizerConfig ToConfig(const v1::OptimizerSpec& spec) {
  OptimizerConfig c;
  c.name = spec.name();
  c.lr = spec.lr();
  c.momentum = spec.momentum();
  c.nesterov = spec.nesterov();
  c.weight_decay = spec.weight_decay();
  c.beta1 = spec.beta1();
  c.beta2 = spec.beta2();
  c.eps = spec.eps();
  return c;
}

SchedulerConfig ToConfig(const v1::SchedulerSpec& spec) {
  SchedulerConfig c;
  c.name = spec.name();
  c.step_size = spec.step_size();
  c.gamma = spec.gamma();
  c.total_steps = spec.total_steps();
  c.min_lr = spec.min_lr();
  return c;
}

// The spec's optimizer, sgd when it names none.
OptimizerConfig SpecOptimizer(const v1::JobSpec& spec) {
  OptimizerConfig optimizer = ToConfig(spec.optimizer());
  if (spec.optimizer().name().empty()) optimizer.name = "sgd";
  return optimizer;
}

absl::Status PrefixedBy(const std::string& field, const absl::Status& status) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(field, ": ", status.message()));
}

}  // namespace

absl::Status CheckSpecOptimizer(const v1::JobSpec& spec) {
  const OptimizerConfig optimizer = SpecOptimizer(spec);
  DTRAIN_RETURN_IF_ERROR(
      PrefixedBy("spec.optimizer", MakeOptimizer({torch::zeros({1})}, optimizer).status()));
  return PrefixedBy("spec.lr_scheduler",
                    LrSchedule::Make(ToConfig(spec.lr_scheduler()), optimizer.lr).status());
}

absl::StatusOr<OptimizerChoice> ChooseOptimizer(const v1::JobSpec& spec,
                                                const std::string& optimization_json) {
  OptimizerChoice choice;
  choice.optimizer = SpecOptimizer(spec);
  choice.schedule = ToConfig(spec.lr_scheduler());
  const std::string optimizer_class = TorchOptimizerClass(choice.optimizer.name);
  if (!spec.optimizer().name().empty()) {
    choice.description = absl::StrCat(
        "the spec's optimizer: ", optimizer_class, " lr ", choice.optimizer.lr,
        optimization_json.empty() ? "" : " (it overrides the model's configure_optimizers)");
    return choice;
  }
  if (optimization_json.empty()) {
    choice.description = absl::StrCat(
        optimizer_class, " lr ", choice.optimizer.lr,
        ": the spec names no optimizer and the model records no configure_optimizers (export it "
        "with dtrain.export to use its own)");
    return choice;
  }
  v1::OptimizationRecipe recipe;
  google::protobuf::util::JsonParseOptions strict;
  strict.ignore_unknown_fields = false;
  if (auto parsed = google::protobuf::util::JsonStringToMessage(optimization_json, &recipe, strict);
      !parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.model: the model's configure_optimizers record does not parse (",
        parsed.message().as_string(), "); export it again with this version's dtrain.export()"));
  }
  absl::StatusOr<OptimizerConfig> made = OptimizerFromRecipe(recipe.optimizer());
  if (!made.ok()) return PrefixedBy("spec.model", made.status());
  choice.optimizer = *std::move(made);
  choice.description =
      absl::StrCat("configure_optimizers: ", recipe.optimizer().kind(),
                   choice.optimizer.groups.size() > 1
                       ? absl::StrCat(" (", choice.optimizer.groups.size(), " param groups)")
                       : absl::StrCat(" lr ", choice.optimizer.lr));
  choice.recipe = std::move(recipe);
  return choice;
}

}  // namespace dtrain
