// A job's metrics on disk: metrics.csv in Lightning's CSVLogger shape (csv_metrics_file.h) and a
// TensorBoard event file beside it, so `tensorboard --logdir <state-dir>/jobs` shows every
// job's curves; hparams.yaml (the resolved spec) is written beside them by the job record.
#pragma once

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/directories.h"
#include "common/tfevents_writer.h"
#include "coordinator/jobs/csv_metrics_file.h"

namespace dtrain {

class MetricsLog {
 public:
  // Creates `dir` (and parents) and both files in it; with `append`, an existing metrics.csv
  // goes on where it ended (a job resumed after a coordinator restart). *note, when not null,
  // gets what the job's log should say: a metrics.csv too large to continue was kept beside.
  static absl::StatusOr<std::unique_ptr<MetricsLog>> Create(const std::string& dir,
                                                            const std::string& host,
                                                            bool append = false,
                                                            std::string* note = nullptr);
  // A file that cannot be written does not stop training; the store keeps the points. Returns
  // what the job's log should say (a file kept beside; the first failed write of metrics.csv
  // after a good one), or an empty string.
  std::string Add(const std::string& name, double value, int64_t step, int64_t epoch,
                  double wall_time);
  // Ends a batch of points; returns as Add.
  std::string Flush();
  std::string csv_path() const { return csv_->path(); }
  std::string events_path() const { return events_->path(); }

 private:
  // What a failed write of metrics.csv says, said once until a write succeeds again.
  std::string CsvOutcome(const absl::Status& status);

  std::unique_ptr<CsvMetricsFile> csv_;
  bool csv_failing_ = false;
  std::unique_ptr<TfEventsWriter> events_;
};

}  // namespace dtrain
