#include "coordinator/jobs/metrics_log.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dtrain {

absl::Status MakeDirectories(const std::string& path) {
  std::error_code error;
  std::filesystem::create_directories(path, error);
  if (error) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create directory '", path, "': ", error.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<MetricsLog>> MetricsLog::Create(const std::string& dir,
                                                               const std::string& host,
                                                               bool append) {
  if (absl::Status s = MakeDirectories(dir); !s.ok()) return s;
  auto log = std::unique_ptr<MetricsLog>(new MetricsLog());
  log->csv_path_ = dir + "/metrics.csv";
  const bool existed = append && std::ifstream(log->csv_path_).good();
  log->csv_.open(log->csv_path_, existed ? std::ios::app : std::ios::trunc);
  if (!log->csv_) {
    return absl::FailedPreconditionError(absl::StrCat("cannot create '", log->csv_path_, "'"));
  }
  if (!existed) log->csv_ << "wall_time,step,epoch,name,value\n";
  absl::StatusOr<std::unique_ptr<TfEventsWriter>> events = TfEventsWriter::Create(dir, host);
  if (!events.ok()) return events.status();
  log->events_ = std::move(*events);
  return log;
}

void MetricsLog::Add(const std::string& name, double value, int64_t step, int64_t epoch,
                     double wall_time) {
  csv_ << absl::StrFormat("%.3f,%d,%d,%s,%.9g", wall_time, step, epoch, name, value) << "\n";
  events_->AddScalar(name, value, step, wall_time).IgnoreError();
}

void MetricsLog::Flush() {
  csv_.flush();
  events_->Flush().IgnoreError();
}

}  // namespace dtrain
