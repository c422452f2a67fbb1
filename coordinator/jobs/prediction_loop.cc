#include "coordinator/jobs/prediction_loop.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/distributed_sampler.h"
#include "common/status_macros.h"
#include "coordinator/jobs/batch_limits.h"

namespace dtrain {

absl::Status PredictionLoop::Run() {
  TrainingState& state = context_.state;
  const v1::DataConfig& d = context_.spec.data();
  // Over the data's own predict split when it has one (a tensors file may), else the test split.
  const std::string split = state.split_size("predict") > 0 ? "predict" : "test";
  int64_t size = state.split_size(split);
  if (size <= 0) {
    return absl::FailedPreconditionError(
        "data: predict runs over the predict split, or the test split, and both are empty");
  }
  const v1::TrainerConfig& trainer = context_.spec.trainer();
  if (BatchLoopOff(trainer, BatchLoop::kPredict)) {
    return absl::FailedPreconditionError(
        absl::StrCat(DescribeBatchLimit(trainer, BatchLoop::kPredict),
                     " leaves predict nothing to do; unset it to predict every batch"));
  }
  context_.SetPhase("predict");
  PhaseClock::Span timed = state.phases.Time("predict");
  if (d.limit_test_samples() > 0) size = std::min(size, d.limit_test_samples());
  RankBatches batches(state.world_size);
  for (int rank = 0; rank < state.world_size; ++rank) {
    batches[rank] =
        Batches(state.streamed(split) ? StreamPositions(size, state.world_size, rank, false)
                                      : EvalShard(size, state.world_size, rank),
                d.eval_batch_size());
  }
  DTRAIN_ASSIGN_OR_RETURN(const int64_t most_batches,
                          LimitRankBatches(trainer, BatchLoop::kPredict, &batches));
  // A fixed number of batches per call (batches_per_call, or 16 when training's are sized by
  // time): each response holds that many batches' outputs, which keeps it small (and within one
  // message of a default client).
  const int64_t per_call = state.calls.PredictBatches();
  for (int64_t first = 0; first < std::max<int64_t>(most_batches, 1); first += per_call) {
    PredictCall call;
    call.split = split;
    call.batches = &batches;
    call.first = first;
    call.count = per_call;
    DTRAIN_ASSIGN_OR_RETURN(PredictResult result, context_.workers.Predict(call));
    for (int rank = 0; rank < state.world_size && rank < static_cast<int>(result.ranks.size());
         ++rank) {
      const auto& shard = batches[rank];
      const auto& outputs = result.ranks[rank];
      for (size_t b = 0; b < outputs.size() && first + b < shard.size(); ++b) {
        std::vector<int64_t> indices = shard[first + b];
        if (state.streamed(split)) {
          // Positions in the rank's chunk; its chunk starts after the lower ranks'.
          const int64_t offset = StreamEvalOffset(state.split_size(split), state.world_size, rank);
          for (int64_t& i : indices) i += offset;
        }
        if (!outputs[b].kept.empty()) {
          // The batch lost samples (on_error: skip): its rows are those it kept.
          std::vector<int64_t> rows;
          for (int64_t k : outputs[b].kept) {
            if (k >= 0 && k < static_cast<int64_t>(indices.size())) rows.push_back(indices[k]);
          }
          indices = std::move(rows);
        }
        DTRAIN_RETURN_IF_ERROR(context_.callbacks.PredictBatch(
            PredictedSamples{rank, static_cast<int64_t>(first + b), indices, outputs[b]}));
      }
    }
  }
  return context_.callbacks.PredictEnd();
}

}  // namespace dtrain
