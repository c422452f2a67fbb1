// metrics.csv in the shape of Lightning's CSVLogger: one column per metric plus `epoch` and
// `step`, columns sorted by name, one row per step with the values logged at it (empty cells
// for the others), so `pandas.read_csv` gives what a Lightning user already plots.
//
// A value for the step of the last row fills that row: the last line is rewritten in place.
// Otherwise a row is appended. A metric logged for the first time adds a column: the rows are
// read back from the file and written again, one at a time, into a new file that replaces it
// (atomically). Only the columns and the last row stay in memory, so a job of millions of steps
// costs the coordinator no more than one of ten. A file from an earlier coordinator (either
// this shape or the older long one, wall_time,step,epoch,name,value) is read back and
// continued; one past kMostMetricsCsvBytes is kept beside under another name instead, and a new
// one starts where it ended. A write that fails leaves the file's earlier rows as they were,
// and the next value writes the file anew.
//
// Thread-safety: none; the job record serializes calls.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dtrain {

// The most of a metrics.csv read back, on a restart or to add a column: past it the file is
// renamed (metrics.1.csv, metrics.2.csv, ...) and a new one begins. Millions of rows of a few
// metrics fit; rewriting one costs its text twice in memory, for a moment.
inline constexpr int64_t kMostMetricsCsvBytes = int64_t{256} << 20;

struct MetricsCsvRow {
  int64_t step = 0;
  int64_t epoch = 0;
  std::map<std::string, double> values;
};

// Calls `visit` with each row of a metrics.csv's text, in order, one at a time. Lenient: a
// record whose cells do not match the header (cut short by a crash) is skipped, as is a value
// that does not parse. The older long form's records, one value each, make a row per step; its
// names were written unquoted, so its records end at every line break.
void ForEachMetricsCsvRow(absl::string_view text,
                          absl::FunctionRef<void(const MetricsCsvRow&)> visit);

// One row as a line of the file (with its line break), cells in `columns`' order.
std::string MetricsCsvLine(const std::vector<std::string>& columns, const MetricsCsvRow& row);

// A metrics.csv's text written again in this file's shape.
struct MetricsCsvText {
  std::string text;
  std::vector<std::string> columns;  // sorted, epoch and step included
  std::optional<MetricsCsvRow> last;
  int64_t last_row_offset = 0;  // where the last row's line starts (the text's end when none)
};

// `text`'s rows under the columns epoch, step, `with` and every name a row holds a value for.
MetricsCsvText RewriteMetricsCsv(absl::string_view text, const std::vector<std::string>& with = {});

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
  // Writes the last row again when a failed write left it unfinished (the destructor does too);
  // *note as for Add.
  absl::Status Flush(std::string* note);

  const std::string& path() const { return path_; }

 private:
  CsvMetricsFile(std::string path, int64_t most_bytes)
      : path_(std::move(path)), most_bytes_(most_bytes) {}
  // Renames the file to the first free <stem>.N.csv beside it; that name.
  absl::StatusOr<std::string> KeepBeside();
  // Back from `beside` after a keep whose new file could not be written (best effort).
  void PutBack(const std::string& beside);
  // Replaces the file with `written`, and takes its columns and last row as this file's.
  absl::Status Replace(MetricsCsvText written);
  // Keeps the file (of `bytes`) beside, then Replace; on failure the kept file is put back. On
  // success *note is the job log's sentence saying where the file went.
  absl::Status ReplaceKeepingBeside(int64_t bytes, MetricsCsvText written, std::string* note);
  // Writes the file anew: its rows before the last read back, then the last one (as memory
  // has it, unless `row` takes its place), then `row`, under `columns`.
  absl::Status Rewrite(const std::vector<std::string>& columns, const MetricsCsvRow& row,
                       bool row_replaces_last, std::string* note);
  absl::Status RewriteLast();
  absl::Status Append();

  const std::string path_;
  const int64_t most_bytes_;
  int fd_ = -1;
  std::vector<std::string> columns_;  // sorted, epoch and step included
  std::optional<MetricsCsvRow> last_;
  // Whether last_ is whole in the file at [last_row_offset_, end_offset_). Either way the file
  // holds the header and every earlier row in [0, last_row_offset_).
  bool last_written_ = true;
  int64_t last_row_offset_ = 0;
  int64_t end_offset_ = 0;
};

}  // namespace dtrain
