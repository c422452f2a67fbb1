#include "coordinator/jobs/evaluation_loop.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "coordinator/jobs/distributed_sampler.h"
#include "coordinator/jobs/logged_metrics.h"
#include "coordinator/jobs/metric_names.h"

namespace dtrain {

absl::Status EvaluationLoop::Run(EvalKind kind) {
  const bool test = kind == EvalKind::kTest;
  const std::string split = test ? "test" : "val";
  TrainingState& state = context_.state;
  const v1::TrainerConfig& trainer = context_.spec.trainer();
  if (!test && trainer.has_limit_val_batches() && trainer.limit_val_batches() == 0) {
    if (state.stage != "fit") {
      return absl::FailedPreconditionError(
          "trainer.limit_val_batches is 0, which turns validation off; unset it to validate");
    }
    if (!said_off_) {
      said_off_ = true;
      context_.trainer.Log("validation is off (trainer.limit_val_batches: 0)");
    }
    return absl::OkStatus();
  }
  if (test && trainer.has_limit_test_batches() && trainer.limit_test_batches() == 0) {
    if (state.stage != "fit") {
      return absl::FailedPreconditionError(
          "trainer.limit_test_batches is 0, which turns the test off; unset it to test");
    }
    context_.trainer.Log("the test is off (trainer.limit_test_batches: 0)");
    return absl::OkStatus();
  }
  int64_t size = state.split_size(split);
  if (size <= 0) {
    if (state.stage == "fit") return absl::OkStatus();  // nothing to evaluate
    return absl::FailedPreconditionError(
        absl::StrCat("data: the dataset has no ", split, " split"));
  }
  context_.SetPhase(test ? "test" : "validate");
  const v1::DataConfig& d = context_.spec.data();
  const int64_t limit_samples = test ? d.limit_test_samples() : d.limit_val_samples();
  if (limit_samples > 0) size = std::min(size, limit_samples);
  const int64_t limit_batches = test ? trainer.limit_test_batches() : trainer.limit_val_batches();
  RankBatches batches(state.world_size);
  for (int rank = 0; rank < state.world_size; ++rank) {
    batches[rank] =
        Batches(state.streamed(split) ? StreamPositions(size, state.world_size, rank, false)
                                      : EvalShard(size, state.world_size, rank),
                d.eval_batch_size());
    if (limit_batches > 0 && static_cast<int64_t>(batches[rank].size()) > limit_batches) {
      batches[rank].resize(limit_batches);
    }
  }
  EvalResult result;
  {
    PhaseClock::Span timed = state.phases.Time(test ? "test" : "validation");
    DTRAIN_ASSIGN_OR_RETURN(result, context_.workers.Evaluate(kind, batches));
  }
  // Sample-weighted means: every sample counts once, whichever rank saw it.
  const std::string prefix = test ? "test_" : "val_";
  ValidationMetrics metrics;
  metrics.by_rank.assign(state.world_size, {});
  std::map<std::string, std::pair<double, int64_t>> sums;
  LoggedAggregates logged;
  for (int rank = 0; rank < state.world_size && rank < static_cast<int>(result.ranks.size());
       ++rank) {
    std::map<std::string, std::pair<double, int64_t>> mine;
    LoggedAggregates my_logged;
    for (const BatchScalars& batch : result.ranks[rank]) {
      logged.AddBatch(batch);
      my_logged.AddBatch(batch);
      NoteProgressBar(batch, &state.prog_bar);
      if (rank == 0) {
        for (const auto& [name, value] : batch.logged) {
          if (value.on_step) metrics.step_logged.emplace_back(StepKey(name, value), value.value);
        }
      }
      for (const auto& [name, value] : batch.scalars) {
        const std::string key = StageMetricName(prefix, name);
        for (auto* sum : {&sums[key], &mine[key]}) {
          sum->first += value * static_cast<double>(batch.size);
          sum->second += batch.size;
        }
      }
    }
    for (const auto& [name, sum] : mine) {
      if (sum.second > 0) metrics.by_rank[rank][name] = sum.first / sum.second;
    }
    // A name the model logged itself wins over a returned value of the same name.
    for (const auto& [name, value] : my_logged.Take()) metrics.by_rank[rank][name] = value;
  }
  for (const auto& [name, sum] : sums) {
    if (sum.second > 0) metrics.overall[name] = sum.first / sum.second;
  }
  for (const auto& [name, value] : logged.Take()) metrics.overall[name] = value;
  if (!test) {
    for (const auto& [name, value] : metrics.overall) state.callback_metrics[name] = value;
  }
  return test ? context_.callbacks.TestEnd(metrics) : context_.callbacks.ValidationEnd(metrics);
}

}  // namespace dtrain
