// EvaluationLoop: one validation or test run over its split, as Lightning's evaluation loop:
// every rank's unpadded shard of the split (data.limit_val_samples / limit_test_samples; at most
// trainer.limit_val_batches batches per rank for validation) in batches of
// data.eval_batch_size, then sample-weighted means of every scalar the steps return, overall
// and per rank, prefixed val_ or test_ (limit_val_batches: 0 turns validation off, as in
// Lightning). The callbacks get them (OnValidationEnd, OnTestEnd):
// the logger reports them, ModelCheckpoint and EarlyStopping act on fit's validations.
//
// Thread-safety: none; the job's thread runs it.
#pragma once

#include "absl/status/status.h"
#include "coordinator/jobs/loop_context.h"

namespace dtrain {

class EvaluationLoop {
 public:
  explicit EvaluationLoop(LoopContext& context) : context_(context) {}

  // Runs `kind` over its split (val or test). A split that is empty or missing is nothing to do
  // during fit, and FAILED_PRECONDITION in the validate and test stages; so is validation with
  // trainer.limit_val_batches: 0.
  absl::Status Run(EvalKind kind);

 private:
  LoopContext& context_;
  bool said_off_ = false;  // the job log said validation is off
};

}  // namespace dtrain
