#include "coordinator/jobs/metrics_log.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dtrain {

absl::StatusOr<std::unique_ptr<MetricsLog>> MetricsLog::Create(const std::string& dir,
                                                               const std::string& host, bool append,
                                                               std::string* note) {
  if (absl::Status s = MakeDirectories(dir); !s.ok()) return s;
  auto log = std::unique_ptr<MetricsLog>(new MetricsLog());
  std::string kept;
  absl::StatusOr<std::unique_ptr<CsvMetricsFile>> csv =
      CsvMetricsFile::Open(dir + "/metrics.csv", append, &kept);
  if (!csv.ok()) return csv.status();
  log->csv_ = std::move(*csv);
  absl::StatusOr<std::unique_ptr<TfEventsWriter>> events = TfEventsWriter::Create(dir, host);
  if (!events.ok()) return events.status();
  log->events_ = std::move(*events);
  if (note != nullptr) *note = std::move(kept);
  return log;
}

std::string MetricsLog::Add(const std::string& name, double value, int64_t step, int64_t epoch,
                            double wall_time) {
  std::string note;
  const absl::Status written = csv_->Add(name, value, step, epoch, &note);
  events_->AddScalar(name, value, step, wall_time).IgnoreError();
  return note.empty() ? CsvOutcome(written) : note;
}

std::string MetricsLog::Flush() {
  std::string note;
  const absl::Status written = csv_->Flush(&note);
  events_->Flush().IgnoreError();
  return note.empty() ? CsvOutcome(written) : note;
}

std::string MetricsLog::CsvOutcome(const absl::Status& status) {
  if (status.ok()) {
    csv_failing_ = false;
    return "";
  }
  if (csv_failing_) return "";
  csv_failing_ = true;
  return absl::StrCat("metrics.csv: ", status.message(),
                      "; every point stays in the job's store (dtrain results), a row left "
                      "unfinished is written again with the next value, and a value whose "
                      "column could not be added is missing from the file");
}

}  // namespace dtrain
