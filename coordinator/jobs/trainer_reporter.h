// TrainerReporter: where a run of a job reports what happens (its log, progress, metric points,
// checkpoints, kept files and predictions). The job's record (job_record.h) implements it; the
// trainer and its callbacks report into it.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/v1/jobs.pb.h"

namespace dtrain {

class TrainerReporter {
 public:
  virtual ~TrainerReporter() = default;
  virtual void Log(const std::string& line) = 0;
  virtual void Progress(const v1::JobProgress& progress) = 0;
  // Points logged together (a callback round's: a training call's values at every logged
  // step), stored together. wall_unix_ms is the reporter's to set.
  virtual void Metrics(const std::vector<v1::MetricPoint>& points) = 0;
  // The job's last and best checkpoints, as a spec names them (job:<id>/<name> or a worker
  // path).
  virtual void Checkpoint(const std::string& last, const std::string& best) = 0;
  // A file the job keeps (replacing one of the same name), and those of its files it no longer
  // keeps (top-k eviction).
  virtual void KeepFile(const v1::JobFile& file, const std::vector<std::string>& dropped) = 0;
  virtual void Predictions(const std::string& path) = 0;
  // The model's save_hyperparameters() values (name, YAML flow text), for hparams.yaml.
  virtual void HyperParameters(const std::vector<std::pair<std::string, std::string>>& values) {}
};

}  // namespace dtrain
