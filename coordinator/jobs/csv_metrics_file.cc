#include "coordinator/jobs/csv_metrics_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/atomic_file.h"
#include "common/csv_cell.h"

namespace dtrain {
namespace {

absl::Status WriteAll(int fd, const std::string& text, const std::string& path) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::FailedPreconditionError(
          absl::StrCat("cannot write '", path, "': ", std::strerror(errno)));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

// The bytes of the open file `fd`, which holds `bytes` of them from its start.
absl::StatusOr<std::string> ReadAll(int fd, int64_t bytes, const std::string& path) {
  std::string text(static_cast<size_t>(bytes), '\0');
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::pread(fd, text.data() + done, text.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot read '", path, "' back: ", std::strerror(errno)));
    }
    if (n == 0) break;  // shorter than its size said: read what is there
    done += static_cast<size_t>(n);
  }
  text.resize(done);
  return text;
}

}  // namespace

MetricsCsv ParseMetricsCsv(absl::string_view text) {
  MetricsCsv csv;
  csv.columns = {"epoch", "step"};
  if (text.empty()) return csv;
  const absl::string_view header = NextCsvRecord(&text);
  const std::vector<std::string> names = SplitCsvLine(header);
  const bool long_form = header == "wall_time,step,epoch,name,value";
  std::vector<MetricsCsvRow>& rows = csv.rows;
  while (!text.empty()) {
    const std::vector<std::string> cells = SplitCsvLine(NextCsvRecord(&text));
    if (cells.size() != names.size()) continue;  // a line cut short by a crash
    if (long_form) {
      int64_t step = 0, epoch = 0;
      double value = 0;
      if (!absl::SimpleAtoi(cells[1], &step) || !absl::SimpleAtoi(cells[2], &epoch) ||
          !absl::SimpleAtod(cells[4], &value)) {
        continue;
      }
      if (rows.empty() || rows.back().step != step || rows.back().values.count(cells[3])) {
        rows.push_back(MetricsCsvRow{step, epoch, {}});
      }
      rows.back().values[cells[3]] = value;
      continue;
    }
    MetricsCsvRow row;
    for (size_t i = 0; i < names.size(); ++i) {
      if (cells[i].empty()) continue;
      if (names[i] == "step") {
        (void)absl::SimpleAtoi(cells[i], &row.step);
      } else if (names[i] == "epoch") {
        (void)absl::SimpleAtoi(cells[i], &row.epoch);
      } else {
        double value = 0;
        if (absl::SimpleAtod(cells[i], &value)) row.values[names[i]] = value;
      }
    }
    rows.push_back(std::move(row));
  }
  for (const MetricsCsvRow& row : rows) {
    for (const auto& [name, value] : row.values) {
      if (std::find(csv.columns.begin(), csv.columns.end(), name) == csv.columns.end()) {
        csv.columns.push_back(name);
      }
    }
  }
  std::sort(csv.columns.begin(), csv.columns.end());
  return csv;
}

std::string MetricsCsvLine(const std::vector<std::string>& columns, const MetricsCsvRow& row) {
  std::vector<std::string> cells;
  cells.reserve(columns.size());
  for (const std::string& column : columns) {
    if (column == "step") {
      cells.push_back(absl::StrCat(row.step));
    } else if (column == "epoch") {
      cells.push_back(absl::StrCat(row.epoch));
    } else {
      auto it = row.values.find(column);
      cells.push_back(it == row.values.end() ? "" : absl::StrFormat("%.9g", it->second));
    }
  }
  return absl::StrJoin(cells, ",") + "\n";
}

std::string MetricsCsvText(const MetricsCsv& csv) {
  std::vector<std::string> cells;
  cells.reserve(csv.columns.size());
  for (const std::string& column : csv.columns) cells.push_back(CsvCell(column));
  std::string text = absl::StrJoin(cells, ",") + "\n";
  for (const MetricsCsvRow& row : csv.rows) text += MetricsCsvLine(csv.columns, row);
  return text;
}

absl::StatusOr<std::unique_ptr<CsvMetricsFile>> CsvMetricsFile::Open(const std::string& path,
                                                                     bool append, std::string* note,
                                                                     int64_t most_bytes) {
  std::unique_ptr<CsvMetricsFile> file(new CsvMetricsFile(path, most_bytes));
  MetricsCsv csv = ParseMetricsCsv("");
  const int fd = append ? ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW) : -1;
  if (append && fd < 0 && errno != ENOENT) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot read '", path, "' to continue it: ", std::strerror(errno)));
  }
  if (fd >= 0) {
    struct stat st;
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      return absl::FailedPreconditionError(
          absl::StrCat("cannot continue '", path, "': not a regular file"));
    }
    if (st.st_size > most_bytes) {
      ::close(fd);
      absl::StatusOr<std::string> kept = file->KeepBeside(st.st_size);
      if (!kept.ok()) return kept.status();
      *note = *kept;
    } else {
      absl::StatusOr<std::string> text = ReadAll(fd, st.st_size, path);
      ::close(fd);
      if (!text.ok()) return text.status();
      csv = ParseMetricsCsv(*text);
    }
  }
  file->columns_ = csv.columns;
  if (absl::Status s = file->RewriteAll(csv); !s.ok()) return s;
  return file;
}

CsvMetricsFile::~CsvMetricsFile() {
  if (fd_ >= 0) ::close(fd_);
}

absl::StatusOr<std::string> CsvMetricsFile::KeepBeside(int64_t bytes) {
  const std::string stem =
      absl::EndsWith(path_, ".csv") ? path_.substr(0, path_.size() - 4) : path_;
  for (int n = 1; n < 10000; ++n) {
    const std::string beside = absl::StrCat(stem, ".", n, ".csv");
    // link + unlink, not rename: link never replaces a file already there.
    if (::link(path_.c_str(), beside.c_str()) != 0) {
      if (errno == EEXIST) continue;
      return absl::FailedPreconditionError(
          absl::StrCat("cannot keep '", path_, "' as '", beside, "': ", std::strerror(errno)));
    }
    ::unlink(path_.c_str());
    return absl::StrCat("'", path_, "' had grown to ", bytes, " bytes, more than the ", most_bytes_,
                        " a coordinator reads back; it is kept as '", beside,
                        "' and a new one continues from here (every point stays in the "
                        "job's store too)");
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "cannot keep '", path_, "' beside: metrics.1.csv to metrics.9999.csv are all taken"));
}

absl::StatusOr<std::string> CsvMetricsFile::ReadBack() const {
  return ReadAll(fd_, end_offset_, path_);
}

absl::Status CsvMetricsFile::RewriteAll(const MetricsCsv& csv) {
  std::string text = MetricsCsvText(csv);
  const int64_t last_start =
      csv.rows.empty()
          ? static_cast<int64_t>(text.size())
          : static_cast<int64_t>(text.size() - MetricsCsvLine(csv.columns, csv.rows.back()).size());
  absl::StatusOr<int> opened = WriteFileAtomicallyKeepOpen(path_, text);
  if (!opened.ok()) return opened.status();
  const int fd = *opened;
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
  last_row_offset_ = last_start;
  end_offset_ = static_cast<int64_t>(text.size());
  if (csv.rows.empty()) {
    last_.reset();
  } else {
    last_ = csv.rows.back();
  }
  return absl::OkStatus();
}

absl::Status CsvMetricsFile::RewriteLast() {
  if (::ftruncate(fd_, last_row_offset_) != 0 || ::lseek(fd_, last_row_offset_, SEEK_SET) < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot rewrite the last row of '", path_, "': ", std::strerror(errno)));
  }
  const std::string line = MetricsCsvLine(columns_, *last_);
  if (absl::Status s = WriteAll(fd_, line, path_); !s.ok()) return s;
  end_offset_ = last_row_offset_ + static_cast<int64_t>(line.size());
  return absl::OkStatus();
}

absl::Status CsvMetricsFile::Append() {
  if (::lseek(fd_, end_offset_, SEEK_SET) < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot append to '", path_, "': ", std::strerror(errno)));
  }
  const std::string line = MetricsCsvLine(columns_, *last_);
  if (absl::Status s = WriteAll(fd_, line, path_); !s.ok()) return s;
  last_row_offset_ = end_offset_;
  end_offset_ += static_cast<int64_t>(line.size());
  return absl::OkStatus();
}

absl::Status CsvMetricsFile::Add(const std::string& name, double value, int64_t step, int64_t epoch,
                                 std::string* note) {
  const bool new_column = std::find(columns_.begin(), columns_.end(), name) == columns_.end();
  bool same_row = last_.has_value() && last_->step == step && last_->values.count(name) == 0;
  if (!new_column) {
    if (same_row) {
      last_->values[name] = value;
      last_->epoch = epoch;
      return RewriteLast();
    }
    last_ = MetricsCsvRow{step, epoch, {{name, value}}};
    return Append();
  }
  // A new column: every line changes, so the rows come back from the file, not from memory.
  MetricsCsv csv;
  if (end_offset_ > most_bytes_) {
    absl::StatusOr<std::string> kept = KeepBeside(end_offset_);
    if (!kept.ok()) return kept.status();
    *note = *kept;
    same_row = false;
  } else {
    absl::StatusOr<std::string> text = ReadBack();
    if (!text.ok()) return text.status();
    csv = ParseMetricsCsv(*text);
  }
  // Ours, not what the rows hold: every column this file was given keeps its place.
  csv.columns = columns_;
  csv.columns.insert(std::upper_bound(csv.columns.begin(), csv.columns.end(), name), name);
  if (same_row && !csv.rows.empty()) {
    csv.rows.back().values[name] = value;
    csv.rows.back().epoch = epoch;
  } else {
    csv.rows.push_back(MetricsCsvRow{step, epoch, {{name, value}}});
  }
  columns_ = csv.columns;
  return RewriteAll(csv);
}

}  // namespace dtrain
