// LightningModule: a TorchScript module that follows Lightning's method names
// (training_step(batch, batch_idx) -> loss; optional validation_step / test_step /
// predict_step returning a tensor or a dict of tensors; forward; optional training_step_end /
// validation_step_end / test_step_end applied to a step's output, and the on_* hooks the job
// calls at Lightning's moments), loaded from a file saved with torch.jit.save or built from the
// zoo. Every call turns libtorch's exceptions into statuses
// carrying libtorch's message, so a bad model or batch never takes the worker down.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <torch/script.h>

#include "absl/status/statusor.h"

namespace dtrain {

// A step's result as named tensors: a dict as returned, a lone tensor under "output".
using StepOutput = std::map<std::string, torch::Tensor>;

class LightningModule {
 public:
  // NOT_FOUND: no such file. INVALID_ARGUMENT: not a TorchScript module, or one without
  // training_step (the message says how to export one).
  static absl::StatusOr<LightningModule> Load(const std::string& path);
  // INVALID_ARGUMENT when `module` has no training_step.
  static absl::StatusOr<LightningModule> Wrap(torch::jit::Module module, std::string origin);

  // The scalar loss: training_step's tensor, or its dict's "loss". INVALID_ARGUMENT with
  // libtorch's message when the batch does not fit the model. The dict's other one-element
  // tensors are kept for TakeTrainingExtras.
  absl::StatusOr<torch::Tensor> TrainingStep(const c10::IValue& batch, int64_t batch_idx);
  // The scalars training_step returned besides its loss (e.g. "acc"), each the mean over the
  // calls since the last take (dp calls once per replica); then forgets them.
  std::map<std::string, double> TakeTrainingExtras();
  // The pieces of a step, for dp (which runs the step on every replica, gathers, and only then
  // applies <step>_end): the method's raw output; <method>_end applied to an output when the
  // module defines it (never for predict_step), else the output as it is; a training output's
  // loss (its extras kept as TrainingStep keeps them); an evaluation output as named tensors.
  absl::StatusOr<c10::IValue> RawStep(const std::string& method, const c10::IValue& batch,
                                      int64_t batch_idx);
  absl::StatusOr<c10::IValue> StepEnd(const std::string& method, c10::IValue output);
  absl::StatusOr<torch::Tensor> TrainingLoss(const c10::IValue& output);
  // predict_step may also return a list or tuple of tensors (named "0", "1", ...).
  absl::StatusOr<StepOutput> ToStepOutput(const std::string& method,
                                          const c10::IValue& output) const;
  // What the last predict_step returned: "tensor", "dict", "list" or "tuple", so that its
  // outputs can be rebuilt as it returned them (BatchResult.output_type).
  const std::string& predict_output_type() const { return predict_output_type_; }
  // The keys of training_step's last output ("loss" alone for a lone tensor), for dry runs.
  const std::vector<std::string>& last_training_keys() const { return last_training_keys_; }
  // FAILED_PRECONDITION when the module does not define the method.
  absl::StatusOr<StepOutput> ValidationStep(const c10::IValue& batch, int64_t batch_idx);
  absl::StatusOr<StepOutput> TestStep(const c10::IValue& batch, int64_t batch_idx);
  absl::StatusOr<StepOutput> PredictStep(const c10::IValue& batch, int64_t batch_idx);
  absl::StatusOr<torch::Tensor> Forward(const torch::Tensor& input);

  bool HasMethod(const std::string& name) const;
  // Lightning's self.current_epoch / self.global_step / self.device, for a module exported with
  // them as attributes (python/dtrain/export.py adds them); a module without them is left alone.
  void SetLoopState(int64_t epoch, int64_t global_step);
  // The loop state `source` holds, for a dp replica (a module of the same type) before a step.
  void CopyLoopStateFrom(const LightningModule& source);
  void SetDevice(const c10::Device& device);
  // What save_hyperparameters() recorded (export() keeps it as the NamedTuple attribute
  // `hparams`), by name in the recorded order; empty for a module without it.
  std::vector<std::pair<std::string, c10::IValue>> HyperParameters() const;
  // The same, each value as YAML flow text (SetupResponse.hyper_parameters, for hparams.yaml).
  // A value YAML cannot hold as save_hyperparameters() records it (a tensor, a dict; lists
  // nested deeper than 32) is left out, and `left_out` says which and why, for the job's log.
  struct HyperParametersText {
    std::vector<std::pair<std::string, std::string>> yaml;  // name, flow text
    std::vector<std::string> left_out;
  };
  HyperParametersText HyperParametersYaml() const;
  // Calls Lightning hook `name` (e.g. "on_train_epoch_start") with no arguments when the module
  // defines it; OK when it does not. INVALID_ARGUMENT with libtorch's message when it fails.
  absl::Status CallHook(const std::string& name);
  std::vector<torch::Tensor> Parameters() const;
  // Whether any of the module's code (any method of it or of a submodule, with what they call)
  // reads a tensor's .grad, so that a strategy knows model code may see the gradients. True
  // when the code cannot be inspected, or calls what it cannot follow (an interface's method).
  bool ReadsGradients() const;
  std::vector<std::pair<std::string, torch::Tensor>> NamedParameters() const;
  void Train(bool on);
  // INVALID_ARGUMENT when the file cannot be written.
  absl::Status Save(const std::string& path) const;

  torch::jit::Module& module() { return module_; }
  const std::string& origin() const { return origin_; }
  // What export() recorded of configure_optimizers (optimization.proto's OptimizationRecipe as
  // JSON, the archive's extra/dtrain/optimization.json); "" when the file has none.
  const std::string& optimization_json() const { return optimization_json_; }

 private:
  LightningModule(torch::jit::Module module, std::string origin);
  absl::StatusOr<c10::IValue> Call(const std::string& method, std::vector<c10::IValue> args);
  // Whether the module has attribute `name` of `kind` (what SetLoopState may write).
  bool HasAttribute(const std::string& name, c10::TypeKind kind) const;
  absl::StatusOr<StepOutput> Step(const std::string& method, const c10::IValue& batch,
                                  int64_t batch_idx);

  torch::jit::Module module_;
  // SetLoopState's attributes, when the module has them as ints.
  std::optional<size_t> epoch_slot_;
  std::optional<size_t> global_step_slot_;
  std::string origin_;  // file path or "builtin:<name>", for messages
  std::string optimization_json_;
  mutable std::string predict_output_type_;  // ToStepOutput's record of predict_step's return
  std::map<std::string, std::pair<double, int>> training_extras_;  // sum, count
  std::vector<std::string> last_training_keys_;
};

}  // namespace dtrain
