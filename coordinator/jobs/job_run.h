// JobRun: one run of a job on the workers placed for it, as the job manager drives it: run, then
// tear down, then say which workers were lost, unreachable or drained. The Trainer is the run
// in production; job_manager_test drives the queue with an in-process stand-in.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace dtrain {

struct TrainerOptions;
class TrainerReporter;

class JobRun {
 public:
  virtual ~JobRun() = default;
  // The run's outcome: OK, CANCELLED after Cancel, or the failure naming the worker.
  virtual absl::Status Run() = 0;
  // Releases every worker of the run, bounded in time.
  virtual void Teardown() = 0;
  // Stops Run from any thread.
  virtual void Cancel() = 0;
  // From any thread, repeatedly while it lasts: `worker` is silent past the heartbeat timeout
  // (`why`). Run's calls to it stop and Run answers UNAVAILABLE naming it; a run that calls no
  // worker has nothing to stop.
  virtual void WorkerLost(const std::string& worker, const std::string& why) {}
  // Workers a call could not reach.
  virtual std::vector<std::string> unreachable_workers() const = 0;
  // After Teardown: unreachable, failed to tear down, or drained.
  virtual std::vector<std::string> lost_workers() const = 0;
  // Workers let go because they were stopping (Run then returned UNAVAILABLE).
  virtual const std::vector<std::string>& drained_workers() const = 0;
};

// Makes the run for one placement of a job; the reporter is the job's record.
using JobRunFactory = std::function<std::unique_ptr<JobRun>(const TrainerOptions& options,
                                                            TrainerReporter* reporter)>;

}  // namespace dtrain
