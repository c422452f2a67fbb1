#include "coordinator/jobs/evaluation_loop.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/distributed_sampler.h"
#include "common/status_macros.h"
#include "coordinator/jobs/batch_limits.h"
#include "coordinator/jobs/logged_metrics.h"
#include "coordinator/jobs/metric_names.h"

namespace dtrain {

absl::StatusOr<RankBatches> EvaluationLoop::Shard(bool test, int64_t most) const {
  const std::string split = test ? "test" : "val";
  const TrainingState& state = context_.state;
  const v1::DataConfig& d = context_.spec.data();
  int64_t size = state.split_size(split);
  const int64_t limit_samples = test ? d.limit_test_samples() : d.limit_val_samples();
  if (limit_samples > 0) size = std::min(size, limit_samples);
  RankBatches batches(state.world_size);
  for (int rank = 0; rank < state.world_size; ++rank) {
    batches[rank] =
        Batches(state.streamed(split) ? StreamPositions(size, state.world_size, rank, false)
                                      : EvalShard(size, state.world_size, rank),
                d.eval_batch_size());
  }
  DTRAIN_RETURN_IF_ERROR(LimitRankBatches(context_.spec.trainer(),
                                          test ? BatchLoop::kTest : BatchLoop::kVal, &batches, most)
                             .status());
  return batches;
}

absl::Status EvaluationLoop::SanityCheck() {
  const v1::TrainerConfig& trainer = context_.spec.trainer();
  const int32_t steps = trainer.num_sanity_val_steps();
  if (steps == 0 || BatchLoopOff(trainer, BatchLoop::kVal) ||
      context_.state.split_size("val") <= 0) {
    return absl::OkStatus();
  }
  context_.SetPhase("sanity_check");
  DTRAIN_ASSIGN_OR_RETURN(RankBatches batches, Shard(/*test=*/false, steps < 0 ? -1 : steps));
  int64_t most = 0;
  for (const auto& mine : batches) most = std::max<int64_t>(most, mine.size());
  PhaseClock::Span timed = context_.state.phases.Time("validation");
  // Nothing it returns or logs is kept: it only proves validation_step runs, before the first
  // training step rather than after the first epoch.
  absl::Status ran = context_.workers.Evaluate(EvalKind::kSanity, batches).status();
  if (!ran.ok()) {
    return absl::Status(ran.code(), absl::StrCat("sanity check (trainer.num_sanity_val_steps: ",
                                                 steps, "; 0 skips it): ", ran.message()));
  }
  context_.trainer.Log(absl::StrCat("sanity check: ", most,
                                    " validation batch(es) per rank ran (trainer."
                                    "num_sanity_val_steps: ",
                                    steps, ")"));
  return absl::OkStatus();
}

absl::Status EvaluationLoop::Run(EvalKind kind) {
  const bool test = kind == EvalKind::kTest;
  const std::string split = test ? "test" : "val";
  TrainingState& state = context_.state;
  const v1::TrainerConfig& trainer = context_.spec.trainer();
  const BatchLoop loop = test ? BatchLoop::kTest : BatchLoop::kVal;
  if (BatchLoopOff(trainer, loop)) {
    const std::string limit = DescribeBatchLimit(trainer, loop);
    if (state.stage != "fit") {
      return absl::FailedPreconditionError(
          absl::StrCat(limit, test ? " turns the test off" : " turns validation off",
                       "; unset it to ", test ? "test" : "validate"));
    }
    if (!said_off_ || test) {
      said_off_ = !test;
      context_.trainer.Log(
          absl::StrCat(test ? "the test is off (" : "validation is off (", limit, ")"));
    }
    return absl::OkStatus();
  }
  if (state.split_size(split) <= 0) {
    if (state.stage == "fit") return absl::OkStatus();  // nothing to evaluate
    return absl::FailedPreconditionError(
        absl::StrCat("data: the dataset has no ", split, " split"));
  }
  context_.SetPhase(test ? "test" : "validate");
  DTRAIN_ASSIGN_OR_RETURN(RankBatches batches, Shard(test, -1));
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
