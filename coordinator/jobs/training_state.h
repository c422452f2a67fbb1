// TrainingState: the one progress state of a run, which the fit, evaluation and prediction
// loops advance and the callbacks read (as Lightning's trainer.state and its loops' progress):
// where the run is (stage, phase, epoch, batch, global step), what it has measured (samples,
// phases, the size of its calls) and what it has kept (the last and best checkpoints).
//
// Thread-safety: none; the job's thread owns it.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "coordinator/jobs/phase_clock.h"
#include "coordinator/jobs/step_call_sizer.h"

namespace dtrain {

struct TrainingState {
  TrainingState(Clock clock, int64_t batches_per_call)
      : phases(std::move(clock)), calls(batches_per_call) {}

  // Fixed once the group is set up.
  std::string stage;  // fit, validate, test, predict
  int world_size = 1;
  std::map<std::string, int64_t> split_sizes;  // train is limited by data.limit_train_samples
  // Splits the workers stream (data.shards): batches are positions, not sample indices.
  std::set<std::string> streamed_splits;
  // The workers deal training batches themselves (GroupSetup.sampled_work).
  bool sampled_work = false;
  int64_t batches_per_epoch = 0;  // per rank
  int64_t total_steps = 0;        // optimizer steps the fit will take
  int64_t max_epochs = 0;
  // configure_optimizers' ReduceLROnPlateau monitors, from the workers' setup: (name, strict).
  std::vector<std::pair<std::string, bool>> plateau_monitors;
  // The last epoch whose end the workers' ReduceLROnPlateau schedulers have stepped on.
  int64_t plateau_stepped_epoch = -1;

  // Where the run is.
  std::string phase;  // setup, train, validate, checkpoint, test, predict, done
  int64_t epoch = 0;
  int64_t batch_in_epoch = 0;
  int64_t global_step = 0;
  // Set by a callback (EarlyStopping) or max_steps: fit ends after the current boundary.
  bool should_stop = false;

  // What it measured.
  absl::Time submitted = absl::InfinitePast();
  absl::Time run_start = absl::InfinitePast();
  absl::Time fit_start = absl::InfinitePast();  // this run's training started
  int64_t fit_start_step = 0;                   // the global step it started from
  int64_t samples_done = 0;                     // training samples since fit_start, all ranks
  // The training span: from this run's first training call to the end of its latest, less the
  // time spent between them in other phases (validation, checkpoints, a re-formation's setup).
  // samples_done over it is the training rate, the one a compute ceiling bounds.
  absl::Time train_span_start = absl::InfinitePast();
  absl::Duration train_span_excluded;  // other phases' time when the span began
  absl::Duration train_span;
  double train_samples_per_second() const {
    const double seconds = absl::ToDoubleSeconds(train_span);
    return seconds > 0 ? static_cast<double>(samples_done) / seconds : 0;
  }
  double train_loss = 0;           // mean over the last call's batches and ranks
  std::set<std::string> prog_bar;  // names logged with prog_bar=True
  // Lightning's callback_metrics, which ReduceLROnPlateau reads: the latest training epoch
  // values the model logged and the latest validation's metrics.
  std::map<std::string, double> callback_metrics;
  std::string collective_plane;
  PhaseClock phases;
  StepCallSizer calls;  // batches per training call

  // What it kept: checkpoints as a spec names them (job:<id>/<name> or worker:/dir/name).
  std::string last_checkpoint;
  std::string best_checkpoint;

  bool streamed(const std::string& split) const { return streamed_splits.count(split) > 0; }
  int64_t split_size(const std::string& split) const {
    auto it = split_sizes.find(split);
    return it == split_sizes.end() ? 0 : it->second;
  }
};

}  // namespace dtrain
