// Trainer callbacks, as Lightning's: behaviour at the loop's boundaries that is not the loop
// itself. The trainer calls them in order (ModelCheckpoint, EarlyStopping, PredictionWriter);
// each sees the run through TrainerControl, never the workers directly.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dtrain {

// What a callback may ask of the running trainer.
class TrainerControl {
 public:
  virtual ~TrainerControl() = default;
  virtual int64_t global_step() const = 0;
  virtual int64_t epoch() const = 0;
  virtual int world_size() const = 0;
  // Every rank saves; rank 0 writes the file `name` in the job's checkpoint directory (its
  // own, whose files go to the coordinator's store, or the workers' shared dirpath), then
  // removes `evict` there. It becomes the job's last checkpoint; `monitored` is kept with it
  // (top-k across a restart of the coordinator).
  struct Save {
    std::string name;
    std::vector<std::string> evict;
    std::optional<double> monitored;
  };
  virtual absl::Status SaveCheckpoint(const Save& save) = 0;
  // The job's best checkpoint by the monitored metric (a name given to SaveCheckpoint).
  virtual void SetBestCheckpoint(const std::string& name) = 0;
  // Whether any rank decided true, agreed by the ranks themselves (reduce_boolean_decision with
  // all=false on the workers), so a stop is the group's decision as in Lightning.
  virtual absl::StatusOr<bool> AnyRankDecides(const std::vector<bool>& by_rank) = 0;
  virtual void Log(const std::string& line) = 0;
  // The job's predictions file was written.
  virtual void ReportPredictions(const std::string& path) = 0;
};

// One validation run's metrics (val_loss, val_acc, ...): sample-weighted over all ranks, and
// each rank's own.
struct ValidationMetrics {
  std::map<std::string, double> overall;
  std::vector<std::map<std::string, double>> by_rank;
};

// predict_step's per-sample outputs: one row per sample index, a value per column.
struct PredictionRows {
  std::set<std::string> columns;
  std::map<int64_t, std::map<std::string, std::string>> rows;
};

class TrainerCallback {
 public:
  virtual ~TrainerCallback() = default;
  // After each step RPC of training, once the optimizer steps are counted.
  virtual absl::Status OnTrainBatchesEnd(TrainerControl& trainer, int64_t step_before) {
    return absl::OkStatus();
  }
  // After each validation during fit; set *stop to end training after it.
  virtual absl::Status OnValidationEnd(TrainerControl& trainer, const ValidationMetrics& metrics,
                                       bool* stop) {
    return absl::OkStatus();
  }
  // Once fit's epochs are over (or it stopped early).
  virtual absl::Status OnTrainEnd(TrainerControl& trainer) { return absl::OkStatus(); }
  // After predict_step over the test split.
  virtual absl::Status OnPredictEnd(TrainerControl& trainer, const PredictionRows& predictions) {
    return absl::OkStatus();
  }
};

// The value of `monitor` in a validation's metrics; FAILED_PRECONDITION naming `section`
// ("checkpoint", "early_stopping") and the metrics the model reports when it is not there.
absl::StatusOr<double> MonitoredValue(const ValidationMetrics& metrics, const std::string& monitor,
                                      const std::string& section);

}  // namespace dtrain
