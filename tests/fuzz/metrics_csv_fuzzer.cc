// libFuzzer target: a metrics.csv as the coordinator reads it back (coordinator/jobs/
// csv_metrics_file.h), when a job resumes after a restart and whenever a new metric adds a
// column. The input is parsed, written, and the written text parsed and written again. A crash,
// a sanitizer report, a second writing that differs from the first (the file would drift at
// every new column or restart), or a row lost on the way is a finding. Built and run by
// tests/fuzz/run.sh.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/strings/string_view.h"
#include "coordinator/jobs/csv_metrics_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  const dtrain::MetricsCsv parsed = dtrain::ParseMetricsCsv(text);
  const std::string once = dtrain::MetricsCsvText(parsed);
  const dtrain::MetricsCsv again = dtrain::ParseMetricsCsv(once);
  if (again.rows.size() != parsed.rows.size() || again.columns != parsed.columns) std::abort();
  if (dtrain::MetricsCsvText(again) != once) std::abort();
  return 0;
}
