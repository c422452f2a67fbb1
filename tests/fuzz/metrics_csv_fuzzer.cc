// libFuzzer target: a metrics.csv as the coordinator reads it back (coordinator/jobs/
// csv_metrics_file.h), when a job resumes after a restart and whenever a new metric adds a
// column. The input is written again by RewriteMetricsCsv, and that text written again. A
// crash, a sanitizer report, a second writing that differs from the first (the file would drift
// at every new column or restart), a row lost or gained on the way, or a last row that is not
// where the writing says is a finding. Built and run by tests/fuzz/run.sh.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/strings/string_view.h"
#include "coordinator/jobs/csv_metrics_file.h"

namespace {

int64_t Rows(absl::string_view text) {
  int64_t rows = 0;
  dtrain::ForEachMetricsCsvRow(text, [&](const dtrain::MetricsCsvRow&) { ++rows; });
  return rows;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  const dtrain::MetricsCsvText once = dtrain::RewriteMetricsCsv(text);
  const dtrain::MetricsCsvText twice = dtrain::RewriteMetricsCsv(once.text);
  if (twice.text != once.text || twice.columns != once.columns) std::abort();
  const int64_t rows = Rows(text);
  if (Rows(once.text) != rows || once.last.has_value() != (rows > 0)) std::abort();
  if (once.last.has_value() && once.text.substr(static_cast<size_t>(once.last_row_offset)) !=
                                   dtrain::MetricsCsvLine(once.columns, *once.last)) {
    std::abort();
  }
  return 0;
}
