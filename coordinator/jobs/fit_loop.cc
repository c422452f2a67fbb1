#include "coordinator/jobs/fit_loop.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <map>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/distributed_sampler.h"
#include "common/status_macros.h"
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
  // Workers that deal the batches themselves are told how (TrainCall.sampling); others are
  // sent every rank's list.
  RankBatches batches;
  if (!state.sampled_work) {
    batches = EveryRankTrainBatches(state.split_size("train"), state.world_size,
                                    state.streamed("train"), spec.data().shuffle(),
                                    spec.seed_everything(), epoch, spec.data().batch_size());
  }
  const int64_t nb = state.batches_per_epoch;
  const double vci = t.val_check_interval();
  const int64_t interval =
      vci <= 1 ? std::max<int64_t>(1, std::llround(vci * nb)) : static_cast<int64_t>(vci);
  const int64_t accumulate = t.accumulate_grad_batches();
  const bool validates = (epoch + 1) % std::max(1, t.check_val_every_n_epoch()) == 0;
  const int64_t save_every = spec.checkpoint().every_n_steps();
  const bool pipelining = !t.has_pipelined_calls() || t.pipelined_calls();
  state.epoch = epoch;
  state.batch_in_epoch = start_batch;
  context_.SetPhase("train");

  // Where a call from batch `b` must end, with the global step at `step` before it: `until`
  // batches later (0: max_steps is reached), and `validates` when validation comes there.
  struct Bound {
    int64_t until = 0;
    bool validates = false;
  };
  auto bound = [&](int64_t b, int64_t step) {
    int64_t next_val = (b / interval + 1) * interval;
    if (vci <= 1) next_val = std::min(next_val, nb);
    // An epoch that check_val_every_n_epoch skips has no validation at all.
    if (!validates) next_val = std::numeric_limits<int64_t>::max();
    int64_t until = std::min<int64_t>(nb - b, next_val - b);
    if (t.max_steps() > 0) {
      // Batches until the max_steps-th optimizer step; windows restart at each epoch.
      const int64_t left = (t.max_steps() - step) * accumulate - b % accumulate;
      if (left <= 0) return Bound{};
      until = std::min(until, left);
    }
    if (save_every > 0) {
      // A call ends at the next multiple of checkpoint.every_n_steps, so ModelCheckpoint saves
      // exactly there (as Lightning's every_n_train_steps), not at whichever call passed it.
      const int64_t next_save = (step / save_every + 1) * save_every;
      const int64_t left = (next_save - step) * accumulate - b % accumulate;
      if (left > 0) until = std::min(until, left);
    }
    until = state.calls.Until(until);
    return Bound{until, b + until == next_val};
  };

  // Calls sent and not yet received, oldest first: one, or two while the next one is pipelined.
  std::deque<SentCall> sent;
  // A loop that ends with a call in flight (an error, a cancellation) takes it back first: no
  // worker may go on training past where the job's state stops.
  absl::Cleanup abandon = [&] {
    if (!sent.empty()) context_.workers.AbandonTrain();
  };
  int64_t b = start_batch;  // the first batch not sent yet
  while (b < nb || !sent.empty()) {
    if (sent.empty()) {
      if (context_.workers.cancelled()) return absl::CancelledError("the job was cancelled");
      // A stopping worker is let go at an optimizer-step boundary (no half-accumulated
      // gradients are lost), after a checkpoint every rank writes, so the job resumes exactly
      // here.
      if (b % accumulate == 0 && draining_) {
        std::vector<std::string> draining = draining_();
        if (!draining.empty()) return LetDrainingWorkersGo(std::move(draining));
      }
      const Bound next = bound(b, state.global_step);
      if (next.until <= 0) {
        state.should_stop = true;
        return absl::OkStatus();
      }
      DTRAIN_RETURN_IF_ERROR(
          SendCall(batches, b, next.until, next.validates, state.global_step, &sent));
      b += next.until;
    }
    // The next call goes out before this one answers when nothing comes between them: not the
    // epoch's end, validation, max_steps, a checkpoint's step or a drain. The optimizer steps it
    // starts from are counted ahead (one per accumulation window: automatic optimization).
    const SentCall& last = sent.back();
    const int64_t steps_after = last.steps_before + b / accumulate - last.call.first / accumulate;
    if (pipelining && sent.size() == 1 && b < nb && !last.validates_after &&
        (t.max_steps() <= 0 || steps_after < t.max_steps()) &&
        (save_every <= 0 || steps_after / save_every == last.steps_before / save_every) &&
        !context_.workers.cancelled() &&
        !(b % accumulate == 0 && draining_ && !draining_().empty())) {
      const Bound next = bound(b, steps_after);
      if (next.until > 0) {
        DTRAIN_RETURN_IF_ERROR(
            SendCall(batches, b, next.until, next.validates, steps_after, &sent));
        b += next.until;
      }
    }
    SentCall received = std::move(sent.front());
    sent.pop_front();
    DTRAIN_RETURN_IF_ERROR(ReceiveCall(
        received, sent.empty() ? std::nullopt : std::optional(sent.front().steps_before)));
    if (received.validates_after) {
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

absl::Status FitLoop::SendCall(const RankBatches& batches, int64_t first, int64_t count,
                               bool validates_after, int64_t steps_before,
                               std::deque<SentCall>* sent) {
  TrainingState& state = context_.state;
  if (!first_step_seen_) {
    first_step_seen_ = true;
    const absl::Duration since_submit = context_.clock() - state.submitted;
    state.phases.Set("first_step", since_submit);
    context_.trainer.Log(absl::StrFormat("first training step starts %.2f s after submit",
                                         absl::ToDoubleSeconds(since_submit)));
  }
  SentCall s;
  s.validates_after = validates_after;
  s.steps_before = steps_before;
  TrainCall& call = s.call;
  call.epoch = state.epoch;
  call.batches = state.sampled_work ? nullptr : &batches;
  call.sampling = {.samples = state.split_size("train"),
                   .shuffle = context_.spec.data().shuffle(),
                   .seed = context_.spec.seed_everything(),
                   .batch_size = context_.spec.data().batch_size()};
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
  s.sent = context_.clock();
  if (state.train_span_start == absl::InfinitePast()) {
    state.train_span_start = s.sent;
    state.train_span_excluded = ElsewhereThanTraining();
  }
  s.pipelined = !sent->empty();
  context_.workers.StartTrain(call);
  sent->push_back(std::move(s));
  return absl::OkStatus();
}

absl::Duration FitLoop::ElsewhereThanTraining() const {
  // Phases that may come between two training calls (a checkpoint, validation, an elastic
  // re-formation's setup): left out of the training span.
  absl::Duration d;
  for (const char* phase : {"setup", "restore", "validation", "checkpoint", "test", "predict"}) {
    d += context_.state.phases.Get(phase);
  }
  return d;
}

absl::Status FitLoop::ReceiveCall(const SentCall& sent, std::optional<int64_t> next_starts_at) {
  TrainingState& state = context_.state;
  const TrainCall& call = sent.call;
  DTRAIN_ASSIGN_OR_RETURN(TrainResult result, context_.workers.FinishTrain());
  const absl::Time call_end = context_.clock();
  // A pipelined call could start only once the call before it ended: its time is counted from
  // there, so that the phase and the sizer count each stretch of training once.
  const absl::Time startable = sent.pipelined ? std::max(sent.sent, last_answer_) : sent.sent;
  last_answer_ = call_end;
  state.phases.Add("train", call_end - startable);
  state.calls.Observe(call.count, call_end - startable, sent.pipelined);
  state.train_span =
      call_end - state.train_span_start - (ElsewhereThanTraining() - state.train_span_excluded);

  TrainBatches outcome;
  outcome.step_before = state.global_step;
  outcome.batches = call.count;
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
  state.batch_in_epoch = call.first + call.count;
  // Before any callback acts on this step (a checkpoint would already hold the next call's).
  if (next_starts_at.has_value() && *next_starts_at != state.global_step) {
    return absl::InternalError(absl::StrCat(
        "after batch ", call.first + call.count, " of epoch ", call.epoch,
        " the workers counted global step ", state.global_step, " where the trainer counted ",
        *next_starts_at,
        " for the call it had sent next; set trainer.pipelined_calls: false and report this"));
  }
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
