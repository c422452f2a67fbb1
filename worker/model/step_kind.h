// Which of a LightningModule's steps a Worker RPC or a loop runs. The enum travels from the
// service edge (TrainingStep, ValidationStep, TestStep, PredictStep RPCs) down to the strategy;
// the method name is looked up only where the TorchScript module is called.
#pragma once

namespace dtrain {

enum class StepKind { kTraining, kValidation, kTest, kPredict };

// The LightningModule method the step runs ("training_step", ...).
inline const char* StepMethodName(StepKind kind) {
  switch (kind) {
    case StepKind::kTraining:
      return "training_step";
    case StepKind::kValidation:
      return "validation_step";
    case StepKind::kTest:
      return "test_step";
    case StepKind::kPredict:
      return "predict_step";
  }
  return "unknown_step";
}

}  // namespace dtrain
