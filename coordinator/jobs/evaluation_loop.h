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

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/jobs/loop_context.h"

namespace dtrain {

class EvaluationLoop {
 public:
  explicit EvaluationLoop(LoopContext& context) : context_(context) {}

  // Runs `kind` over its split (val or test). A split that is empty or missing is nothing to do
  // during fit, and FAILED_PRECONDITION in the validate and test stages; so is validation with
  // trainer.limit_val_batches: 0.
  absl::Status Run(EvalKind kind);

  // Lightning's sanity check before fit: trainer.num_sanity_val_steps validation batches per
  // rank (-1: all), whose results are dropped. Nothing to do when it is 0, when validation is
  // off or there is no validation split. A failure names the setting that skips it.
  absl::Status SanityCheck();

 private:
  // Every rank's batches of the val or test split, as the limits allow, at most `most` each
  // (-1: no further bound).
  absl::StatusOr<RankBatches> Shard(bool test, int64_t most) const;

  LoopContext& context_;
  bool said_off_ = false;  // the job log said validation is off
};

}  // namespace dtrain
