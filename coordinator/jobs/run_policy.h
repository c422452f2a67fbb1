// What the job manager does when one run of a job (a Trainer on a set of workers) has ended:
// publish the outcome, re-form on survivors plus idle workers, wait in the queue, or fail. A pure
// function of how the run ended, so each case is unit-tested without workers (run_policy_test).
#pragma once

#include <string>

#include "absl/status/status.h"
#include "dtrain/v1/jobs.pb.h"

namespace dtrain {

// How one run ended, as the job manager knows it.
struct RunEnding {
  absl::Status status;            // what Trainer::Run returned
  bool cancel_requested = false;  // the user cancelled the job
  // Stopping (DRAINING) workers were let go after a checkpoint: a planned stop, not a failure.
  bool drained = false;
  int num_nodes = 1;     // the spec's trainer.num_nodes
  int min_nodes = 1;     // trainer.min_nodes (== num_nodes: not elastic)
  int max_restarts = 0;  // trainer.max_restarts
  int restarts = 0;      // re-formations after lost workers so far (drains do not count)
};

// Before teardown: whether another run may follow. When not, the outcome is final: a failure is
// published at once rather than after a stopped worker's teardown deadline, a success once its
// workers are released.
bool MayRunAgain(const RunEnding& ending);

enum class NextRun {
  kEnd,      // publish Outcome(status): the job is over
  kReform,   // run again now on the available workers, from the last checkpoint
  kRequeue,  // drained with too few workers left: back to the head of the queue to resume
  kFail,     // lost workers and too few left to go on: FAILED, saying so
};

struct RunDecision {
  NextRun next = NextRun::kEnd;
  bool uses_restart = false;  // counts against max_restarts (a lost worker, not a drain)
};

// After teardown, once it is known how many workers were lost (unreachable, or their teardown
// failed) and how many a new run would have (survivors plus idle replacements, at most
// num_nodes).
RunDecision DecideNextRun(const RunEnding& ending, int lost_workers, int available_workers);

// The terminal state and reason a run's status gives a job.
struct Outcome {
  v1::JobState state = v1::SUCCEEDED;
  std::string reason;
};
Outcome OutcomeOf(const absl::Status& status, bool cancel_requested);

}  // namespace dtrain
