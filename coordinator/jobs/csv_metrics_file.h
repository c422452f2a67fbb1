// metrics.csv in the shape of Lightning's CSVLogger: one column per metric plus `epoch` and
// `step`, columns sorted by name, one row per step with the values logged at it (empty cells
// for the others), so `pandas.read_csv` gives what a Lightning user already plots.
//
// A metric logged for the first time adds a column: the file is rewritten whole (atomically).
// A value for the step of the last row fills that row: the last line is rewritten in place.
// Otherwise a row is appended. A file from an earlier coordinator (either this shape or the
// older long one, wall_time,step,epoch,name,value) is read back and continued.
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

namespace dtrain {

class CsvMetricsFile {
 public:
  // Creates `path`, or with `append` continues the file already there.
  static absl::StatusOr<std::unique_ptr<CsvMetricsFile>> Open(const std::string& path, bool append);
  ~CsvMetricsFile();

  absl::Status Add(const std::string& name, double value, int64_t step, int64_t epoch);

  const std::string& path() const { return path_; }

 private:
  struct Row {
    int64_t step = 0;
    int64_t epoch = 0;
    std::map<std::string, double> values;
  };

  explicit CsvMetricsFile(std::string path) : path_(std::move(path)) {}
  absl::Status Load();
  std::string Header() const;
  std::string Line(const Row& row) const;
  absl::Status RewriteAll();
  absl::Status RewriteLast();
  absl::Status Append();

  const std::string path_;
  int fd_ = -1;
  std::vector<std::string> columns_;  // sorted, epoch and step included
  std::vector<Row> rows_;
  int64_t last_row_offset_ = 0;  // where the last row's line starts in the file
  int64_t end_offset_ = 0;
};

}  // namespace dtrain
