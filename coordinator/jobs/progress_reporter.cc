#include "coordinator/jobs/progress_reporter.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dtrain {

void ProgressReporter::Report(TrainerControl& trainer) {
  const TrainingState& state = trainer.state();
  progress_.set_phase(state.phase);
  progress_.set_epoch(state.epoch);
  progress_.set_batch_in_epoch(state.batch_in_epoch);
  progress_.set_collective_plane(state.collective_plane);
  state.phases.Export(progress_.mutable_phase_seconds());
  progress_.set_global_step(state.global_step);
  progress_.set_total_steps(state.total_steps);
  progress_.set_batches_per_epoch(state.batches_per_epoch);
  progress_.set_max_epochs(state.max_epochs);
  progress_.set_train_loss(state.train_loss);
  progress_.clear_prog_bar();
  for (const std::string& name : state.prog_bar) progress_.add_prog_bar(name);
  const double seconds = absl::ToDoubleSeconds(trainer.Now() - state.fit_start);
  if (seconds > 0 && state.samples_done > 0) {
    progress_.set_samples_per_second(static_cast<double>(state.samples_done) / seconds);
  }
  progress_.set_train_samples_per_second(state.train_samples_per_second());
  // From this run's own pace: a resumed run counts only the steps it took itself.
  const int64_t steps = state.global_step - state.fit_start_step;
  if (seconds > 0 && steps > 0 && state.total_steps > state.global_step) {
    progress_.set_eta_seconds(seconds / static_cast<double>(steps) *
                              static_cast<double>(state.total_steps - state.global_step));
  } else {
    progress_.set_eta_seconds(0);
  }
  trainer.ReportProgress(progress_);
}

void ProgressReporter::OnRunEnd(TrainerControl& trainer, const absl::Status& status) {
  // Where the run's seconds went, also for a failed run (a slow setup that timed out shows).
  const TrainingState& state = trainer.state();
  const absl::Time now = trainer.Now();
  trainer.Log(absl::StrCat(
      "time by phase: ", state.phases.Summary(now - state.run_start),
      absl::StrFormat("; %.1f s since submit", absl::ToDoubleSeconds(now - state.submitted))));
  if (state.train_span > absl::ZeroDuration()) {
    trainer.Log(absl::StrFormat(
        "trained at %.1f samples/s over %.1f s (first training step to the last, validation "
        "and checkpoints left out); %.1f samples/s over the whole run",
        state.train_samples_per_second(), absl::ToDoubleSeconds(state.train_span),
        progress_.samples_per_second()));
  }
  Report(trainer);
}

}  // namespace dtrain
