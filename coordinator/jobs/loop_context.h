// LoopContext: what the fit, evaluation and prediction loops share: the job's spec, its workers,
// the one progress state, the callbacks and the clock. The trainer owns each of them; a loop
// holds the context for one run.
//
// Thread-safety: none; the job's thread owns it.
#pragma once

#include <string>

#include "absl/time/time.h"
#include "common/clock.h"
#include "coordinator/jobs/trainer_callback.h"
#include "coordinator/jobs/training_state.h"
#include "coordinator/jobs/worker_group.h"
#include "dtrain/v1/jobs.pb.h"

namespace dtrain {

struct LoopContext {
  const v1::JobSpec& spec;
  WorkerGroup& workers;
  TrainingState& state;
  CallbackList& callbacks;
  TrainerControl& trainer;  // the job's log, for what the loops say themselves
  Clock clock;

  // A new phase of the run; the callbacks hear of it (progress).
  void SetPhase(const std::string& phase) {
    state.phase = phase;
    callbacks.Progress();
  }
};

}  // namespace dtrain
