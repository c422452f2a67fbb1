// PredictionLoop: predict_step over the data's predict split (or its test split when it has
// none), as Lightning's prediction loop: every rank's unpadded shard in batches of
// data.eval_batch_size (at most data.limit_test_samples samples), a fixed number of batches per
// call so that each answer stays small (trainer.limit_predict_batches bounds each rank's), and
// each batch's outputs handed to the callbacks with its sample indices (PredictionWriter).
//
// Thread-safety: none; the job's thread runs it.
#pragma once

#include "absl/status/status.h"
#include "coordinator/jobs/loop_context.h"

namespace dtrain {

class PredictionLoop {
 public:
  explicit PredictionLoop(LoopContext& context) : context_(context) {}

  // FAILED_PRECONDITION when both the predict and the test split are empty.
  absl::Status Run();

 private:
  LoopContext& context_;
};

}  // namespace dtrain
