#include "coordinator/jobs/metrics_log.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dtrain {

absl::StatusOr<std::unique_ptr<MetricsLog>> MetricsLog::Create(const std::string& dir,
                                                               const std::string& host,
                                                               bool append) {
  if (absl::Status s = MakeDirectories(dir); !s.ok()) return s;
  auto log = std::unique_ptr<MetricsLog>(new MetricsLog());
  absl::StatusOr<std::unique_ptr<CsvMetricsFile>> csv =
      CsvMetricsFile::Open(dir + "/metrics.csv", append);
  if (!csv.ok()) return csv.status();
  log->csv_ = std::move(*csv);
  absl::StatusOr<std::unique_ptr<TfEventsWriter>> events = TfEventsWriter::Create(dir, host);
  if (!events.ok()) return events.status();
  log->events_ = std::move(*events);
  return log;
}

void MetricsLog::Add(const std::string& name, double value, int64_t step, int64_t epoch,
                     double wall_time) {
  // A metrics file that cannot be written does not stop training; the store keeps the points.
  csv_->Add(name, value, step, epoch).IgnoreError();
  events_->AddScalar(name, value, step, wall_time).IgnoreError();
}

void MetricsLog::Flush() { events_->Flush().IgnoreError(); }

}  // namespace dtrain
