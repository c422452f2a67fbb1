// metrics.csv in the shape of Lightning's CSVLogger: one column per metric plus `epoch` and
// `step`, columns sorted by name, one row per step with the values logged at it (empty cells
// for the others), so `pandas.read_csv` gives what a Lightning user already plots.
//
// A metric logged for the first time adds a column: the file is read back and rewritten whole
// (atomically). A value for the step of the last row fills that row: the last line is rewritten
// in place. Otherwise a row is appended. Only the columns and the last row stay in memory, so a
// job of millions of steps costs the coordinator no more than one of ten. A file from an earlier
// coordinator (either this shape or the older long one, wall_time,step,epoch,name,value) is read
// back and continued; one past kMostMetricsCsvBytes is kept beside under another name instead,
// and the new file starts where it ended.
//
// Thread-safety: none; the job record serializes calls.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dtrain {

// The most of a metrics.csv read back, on a restart or to add a column: past it the file is
// renamed (metrics.1.csv, metrics.2.csv, ...) and a new one begins. Millions of rows of a few
// metrics fit; reading it back costs seconds, not the coordinator's memory.
inline constexpr int64_t kMostMetricsCsvBytes = int64_t{256} << 20;

struct MetricsCsvRow {
  int64_t step = 0;
  int64_t epoch = 0;
  std::map<std::string, double> values;
};

struct MetricsCsv {
  std::vector<std::string> columns;  // sorted, epoch and step included
  std::vector<MetricsCsvRow> rows;
};

// A metrics.csv's text read back, leniently: a record whose cells do not match the header (cut
// short by a crash) or whose numbers do not parse is skipped, and the columns are epoch, step
// and the names that hold a value.
MetricsCsv ParseMetricsCsv(absl::string_view text);

// One row as a line of the file (with its line break), cells in `columns`' order.
std::string MetricsCsvLine(const std::vector<std::string>& columns, const MetricsCsvRow& row);

// The whole file: the header, then a line per row.
std::string MetricsCsvText(const MetricsCsv& csv);

class CsvMetricsFile {
 public:
  // Creates `path`, or with `append` continues the file already there. When that file was too
  // large to read back (over `most_bytes`) and was kept beside, *note says where.
  static absl::StatusOr<std::unique_ptr<CsvMetricsFile>> Open(
      const std::string& path, bool append, std::string* note,
      int64_t most_bytes = kMostMetricsCsvBytes);
  ~CsvMetricsFile();

  // *note says so when the file had grown too large to add a column to and was kept beside.
  absl::Status Add(const std::string& name, double value, int64_t step, int64_t epoch,
                   std::string* note);

  const std::string& path() const { return path_; }

 private:
  CsvMetricsFile(std::string path, int64_t most_bytes)
      : path_(std::move(path)), most_bytes_(most_bytes) {}
  // Renames the file to the first free metrics.N.csv beside it; the sentence that says so.
  absl::StatusOr<std::string> KeepBeside(int64_t bytes);
  absl::StatusOr<std::string> ReadBack() const;
  absl::Status RewriteAll(const MetricsCsv& csv);
  absl::Status RewriteLast();
  absl::Status Append();

  const std::string path_;
  const int64_t most_bytes_;
  int fd_ = -1;
  std::vector<std::string> columns_;  // sorted, epoch and step included
  std::optional<MetricsCsvRow> last_;
  int64_t last_row_offset_ = 0;  // where the last row's line starts in the file
  int64_t end_offset_ = 0;
};

}  // namespace dtrain
