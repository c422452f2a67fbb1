#include "coordinator/jobs/fit_loop.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "coordinator/jobs/distributed_sampler.h"
#include "coordinator/jobs/model_checkpoint.h"

namespace dtrain {

absl::Status FitLoop::Run(int64_t start_epoch, int64_t start_batch) {
  TrainingState& state = context_.state;
  for (int64_t epoch = start_epoch; epoch < state.max_epochs && !state.should_stop; ++epoch) {
    DTRAIN_RETURN_IF_ERROR(TrainEpoch(epoch, epoch == start_epoch ? start_batch : 0));
    DTRAIN_RETURN_IF_ERROR(context_.callbacks.TrainEpochEnd());
  }
  return context_.callbacks.TrainEnd();
}

absl::Status FitLoop::TrainEpoch(int64_t epoch, int64_t start_batch) {
  const v1::JobSpec& spec = context_.spec;
  const v1::TrainerConfig& t = spec.trainer();
  TrainingState& state = context_.state;
  RankBatches batches(state.world_size);
  for (int r = 0; r < state.world_size; ++r) {
    batches[r] = Batches(state.streamed("train")
                             ? StreamPositions(state.split_size("train"), state.world_size, r, true)
                             : TrainShard(state.split_size("train"), state.world_size, r,
                                          spec.data().shuffle(), spec.seed_everything(), epoch),
                         spec.data().batch_size());
  }
  const int64_t nb = state.batches_per_epoch;
  const double vci = t.val_check_interval();
  const int64_t interval =
      vci <= 1 ? std::max<int64_t>(1, std::llround(vci * nb)) : static_cast<int64_t>(vci);
  const int64_t accumulate = t.accumulate_grad_batches();
  const bool validates = (epoch + 1) % std::max(1, t.check_val_every_n_epoch()) == 0;
  state.epoch = epoch;
  state.batch_in_epoch = start_batch;
  context_.SetPhase("train");
  int64_t b = start_batch;
  while (b < nb) {
    if (context_.workers.cancelled()) return absl::CancelledError("the job was cancelled");
    // A stopping worker is let go at an optimizer-step boundary (no half-accumulated
    // gradients are lost), after a checkpoint every rank writes, so the job resumes exactly here.
    if (b % accumulate == 0 && draining_) {
      std::vector<std::string> draining = draining_();
      if (!draining.empty()) return LetDrainingWorkersGo(std::move(draining));
    }
    int64_t next_val = (b / interval + 1) * interval;
    if (vci <= 1) next_val = std::min(next_val, nb);
    // An epoch that check_val_every_n_epoch skips has no validation at all.
    if (!validates) next_val = std::numeric_limits<int64_t>::max();
    // Batches until the next point a call must end at.
    int64_t until = std::min<int64_t>(nb - b, next_val - b);
    if (t.max_steps() > 0) {
      // Batches until the max_steps-th optimizer step; windows restart at each epoch.
      const int64_t left = (t.max_steps() - state.global_step) * accumulate - b % accumulate;
      if (left <= 0) {
        state.should_stop = true;
        return absl::OkStatus();
      }
      until = std::min(until, left);
    }
    if (const int64_t every = spec.checkpoint().every_n_steps(); every > 0) {
      // A call ends at the next multiple of checkpoint.every_n_steps, so ModelCheckpoint saves
      // exactly there (as Lightning's every_n_train_steps), not at whichever call passed it.
      const int64_t next_save = (state.global_step / every + 1) * every;
      const int64_t left = (next_save - state.global_step) * accumulate - b % accumulate;
      if (left > 0) until = std::min(until, left);
    }
    const int64_t chunk = state.calls.Until(until);
    DTRAIN_RETURN_IF_ERROR(TrainingCall(batches, b, chunk));
    b += chunk;
    if (b == next_val) {
      DTRAIN_RETURN_IF_ERROR(validation_.Run(EvalKind::kValidation));
      if (state.should_stop) return absl::OkStatus();
      context_.SetPhase("train");
    }
    if (t.max_steps() > 0 && state.global_step >= t.max_steps()) {
      state.should_stop = true;
      return absl::OkStatus();
    }
  }
  return absl::OkStatus();
}

absl::Status FitLoop::TrainingCall(const RankBatches& batches, int64_t first, int64_t count) {
  TrainingState& state = context_.state;
  if (!first_step_seen_) {
    first_step_seen_ = true;
    const absl::Duration since_submit = context_.clock() - state.submitted;
    state.phases.Set("first_step", since_submit);
    context_.trainer.Log(absl::StrFormat("first training step starts %.2f s after submit",
                                         absl::ToDoubleSeconds(since_submit)));
  }
  TrainCall call;
  call.epoch = state.epoch;
  call.batches = &batches;
  call.first = first;
  call.count = count;
  call.end_of_epoch = first + count == state.batches_per_epoch;
  call.total_steps = state.total_steps;
  // A new epoch's first call carries what the last one's validation measured, which
  // configure_optimizers' ReduceLROnPlateau steps on (Lightning steps it after validation).
  if (first == 0 && state.epoch > 0 && state.epoch - 1 > state.plateau_stepped_epoch) {
    state.plateau_stepped_epoch = state.epoch - 1;
    for (const auto& [monitor, strict] : state.plateau_monitors) {
      auto it = state.callback_metrics.find(monitor);
      if (it != state.callback_metrics.end()) {
        call.monitored[monitor] = it->second;
        continue;
      }
      if (!strict) continue;
      std::vector<std::string> names;
      for (const auto& [name, value] : state.callback_metrics) names.push_back(name);
      return absl::FailedPreconditionError(absl::StrCat(
          "ReduceLROnPlateau conditioned on metric '", monitor,
          "' which is not available after "
          "epoch ",
          state.epoch - 1, names.empty() ? "" : " (available: ", absl::StrJoin(names, ", "),
          names.empty() ? "" : ")",
          ": log it with self.log in validation_step or with on_epoch=True in training_step, or "
          "set \"strict\": False in the lr_scheduler dict"));
    }
  }
  const absl::Time call_start = context_.clock();
  // Phases that may come between two training calls (a checkpoint, validation, an elastic
  // re-formation's setup): left out of the training span.
  auto elsewhere = [&state] {
    absl::Duration d;
    for (const char* phase : {"setup", "restore", "validation", "checkpoint", "test", "predict"}) {
      d += state.phases.Get(phase);
    }
    return d;
  };
  if (state.train_span_start == absl::InfinitePast()) {
    state.train_span_start = call_start;
    state.train_span_excluded = elsewhere();
  }
  TrainResult result;
  {
    PhaseClock::Span timed = state.phases.Time("train");
    DTRAIN_ASSIGN_OR_RETURN(result, context_.workers.Train(call));
  }
  const absl::Time call_end = context_.clock();
  state.calls.Observe(count, call_end - call_start);
  state.train_span = call_end - state.train_span_start - (elsewhere() - state.train_span_excluded);

  TrainBatches outcome;
  outcome.step_before = state.global_step;
  outcome.batches = count;
  outcome.epoch_end = call.end_of_epoch;
  outcome.result = &result;
  std::map<std::string, std::pair<double, int64_t>> sums;
  for (size_t r = 0; r < result.ranks.size(); ++r) {
    const RankTrainResult& rank = result.ranks[r];
    state.global_step = rank.global_step;
    int64_t step = outcome.step_before;
    for (const BatchScalars& batch : rank.batches) {
      train_logged_.AddBatch(batch);
      NoteProgressBar(batch, &state.prog_bar);
      if (batch.optimizer_stepped) ++step;
      if (r == 0 && batch.optimizer_stepped && !batch.logged.empty()) {
        TrainBatches::StepValues values{step, {}};
        for (const auto& [name, value] : batch.logged) {
          if (value.on_step) values.values[StepKey(name, value)] = value.value;
        }
        if (!values.values.empty()) outcome.step_logged.push_back(std::move(values));
      }
      for (const auto& [name, value] : batch.scalars) {
        auto& [sum, n] = sums[name];
        sum += value;
        ++n;
      }
      state.samples_done += batch.size;
    }
  }
  for (const auto& [name, sum] : sums) {
    if (sum.second > 0) outcome.means[name] = sum.first / static_cast<double>(sum.second);
  }
  if (call.end_of_epoch) {
    outcome.epoch_logged = train_logged_.Take();
    for (const auto& [name, value] : outcome.epoch_logged) state.callback_metrics[name] = value;
  }
  auto loss = outcome.means.find("loss");
  state.train_loss = loss == outcome.means.end() ? 0.0 : loss->second;
  state.batch_in_epoch = first + count;
  return context_.callbacks.TrainBatchesEnd(outcome);
}

absl::Status FitLoop::LetDrainingWorkersGo(std::vector<std::string> names) {
  std::vector<std::string> quoted;
  for (const std::string& name : names) quoted.push_back(absl::StrCat("'", name, "'"));
  const int64_t step = context_.state.global_step;
  context_.trainer.Log(absl::StrCat("worker(s) ", absl::StrJoin(quoted, ", "),
                                    " are stopping: checkpointing at step ", step,
                                    " to let them go"));
  // Every rank writes where the job resumes: last.ckpt, as ModelCheckpoint names it.
  DTRAIN_RETURN_IF_ERROR(
      context_.trainer.SaveCheckpoint({ModelCheckpoint::kLastName, {}, std::nullopt}));
  drained_ = std::move(names);
  return absl::UnavailableError(absl::StrCat("worker(s) ", absl::StrJoin(quoted, ", "),
                                             " stopped (drained); checkpointed at step ", step));
}

}  // namespace dtrain
