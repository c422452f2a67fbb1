#include "coordinator/jobs/csv_metrics_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>
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

void ForEachMetricsCsvRow(absl::string_view text,
                          absl::FunctionRef<void(const MetricsCsvRow&)> visit) {
  if (text.empty()) return;
  const absl::string_view header = NextCsvRecord(&text);
  const std::vector<std::string> names = SplitCsvLine(header);
  // Every line this file writes ends in a break: a last record without one was cut short by a
  // crash or a failed write, and could read as a row of another step (a step cell cut to "12").
  if (const size_t end = text.rfind('\n'); end == absl::string_view::npos) {
    text = absl::string_view();
  } else {
    text = text.substr(0, end + 1);
  }
  if (header == "wall_time,step,epoch,name,value") {
    std::optional<MetricsCsvRow> row;
    while (!text.empty()) {
      const size_t end = text.find('\n');
      const absl::string_view line = text.substr(0, end);
      text.remove_prefix(end == absl::string_view::npos ? text.size() : end + 1);
      const std::vector<std::string> cells = SplitCsvLine(line);
      int64_t step = 0, epoch = 0;
      double value = 0;
      if (cells.size() != names.size() || !absl::SimpleAtoi(cells[1], &step) ||
          !absl::SimpleAtoi(cells[2], &epoch) || !absl::SimpleAtod(cells[4], &value)) {
        continue;  // a line cut short by a crash
      }
      if (!row.has_value() || row->step != step || row->values.count(cells[3]) != 0) {
        if (row.has_value()) visit(*row);
        row = MetricsCsvRow{step, epoch, {}};
      }
      row->values[cells[3]] = value;
      row->epoch = epoch;  // the latest, as Add keeps it
    }
    if (row.has_value()) visit(*row);
    return;
  }
  while (!text.empty()) {
    const std::vector<std::string> cells = SplitCsvLine(NextCsvRecord(&text));
    if (cells.size() != names.size()) continue;  // a line cut short by a crash
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
    visit(row);
  }
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

MetricsCsvText RewriteMetricsCsv(absl::string_view text, const std::vector<std::string>& with) {
  // Two passes over the text, a row at a time: the columns, then the lines under them.
  std::set<std::string> names(with.begin(), with.end());
  names.insert("epoch");
  names.insert("step");
  ForEachMetricsCsvRow(text, [&](const MetricsCsvRow& row) {
    for (const auto& [name, value] : row.values) names.insert(name);
  });
  MetricsCsvText out;
  out.columns.assign(names.begin(), names.end());
  std::vector<std::string> header;
  header.reserve(out.columns.size());
  for (const std::string& column : out.columns) header.push_back(CsvCell(column));
  out.text = absl::StrJoin(header, ",") + "\n";
  out.text.reserve(out.text.size() + text.size() + text.size() / 4);  // grown once, if at all
  out.last_row_offset = static_cast<int64_t>(out.text.size());
  ForEachMetricsCsvRow(text, [&](const MetricsCsvRow& row) {
    out.last_row_offset = static_cast<int64_t>(out.text.size());
    out.text += MetricsCsvLine(out.columns, row);
    out.last = row;
  });
  return out;
}

absl::StatusOr<std::unique_ptr<CsvMetricsFile>> CsvMetricsFile::Open(const std::string& path,
                                                                     bool append, std::string* note,
                                                                     int64_t most_bytes) {
  std::unique_ptr<CsvMetricsFile> file(new CsvMetricsFile(path, most_bytes));
  std::string text;
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
      absl::Status s = file->ReplaceKeepingBeside(st.st_size, RewriteMetricsCsv(""), note);
      if (!s.ok()) return s;
      return file;
    } else {
      absl::StatusOr<std::string> read = ReadAll(fd, st.st_size, path);
      ::close(fd);
      if (!read.ok()) return read.status();
      text = *std::move(read);
    }
  }
  if (absl::Status s = file->Replace(RewriteMetricsCsv(text)); !s.ok()) return s;
  return file;
}

CsvMetricsFile::~CsvMetricsFile() {
  std::string note;  // nobody to tell: a file kept beside says so by its name
  Flush(&note).IgnoreError();
  if (fd_ >= 0) ::close(fd_);
}

absl::Status CsvMetricsFile::Flush(std::string* note) {
  if (last_written_ || !last_.has_value()) return absl::OkStatus();
  return Rewrite(columns_, *last_, /*row_replaces_last=*/true, note);
}

void CsvMetricsFile::PutBack(const std::string& beside) {
  // Best effort: the file is where a reader and the next coordinator look for it again.
  if (::link(beside.c_str(), path_.c_str()) == 0) ::unlink(beside.c_str());
}

absl::StatusOr<std::string> CsvMetricsFile::KeepBeside() {
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
    return beside;
  }
  return absl::FailedPreconditionError(absl::StrCat("cannot keep '", path_, "' beside: ", stem,
                                                    ".1.csv to ", stem, ".9999.csv are all taken"));
}

absl::Status CsvMetricsFile::Replace(MetricsCsvText written) {
  absl::StatusOr<int> opened = WriteFileAtomicallyKeepOpen(path_, written.text);
  if (!opened.ok()) return opened.status();
  if (fd_ >= 0) ::close(fd_);
  fd_ = *opened;
  columns_ = std::move(written.columns);
  last_ = std::move(written.last);
  last_written_ = true;
  last_row_offset_ = written.last_row_offset;
  end_offset_ = static_cast<int64_t>(written.text.size());
  return absl::OkStatus();
}

absl::Status CsvMetricsFile::ReplaceKeepingBeside(int64_t bytes, MetricsCsvText written,
                                                  std::string* note) {
  absl::StatusOr<std::string> beside = KeepBeside();
  if (!beside.ok()) return beside.status();
  if (absl::Status s = Replace(std::move(written)); !s.ok()) {
    // The file goes back where it was, and this file's state still describes it.
    PutBack(*beside);
    return s;
  }
  *note = absl::StrCat("'", path_, "' had grown to ", bytes, " bytes, more than the ", most_bytes_,
                       " a coordinator reads back; it is kept as '", *beside,
                       "' and a new one continues from here (every point stays in the job's "
                       "store too)");
  return absl::OkStatus();
}

absl::Status CsvMetricsFile::Rewrite(const std::vector<std::string>& columns,
                                     const MetricsCsvRow& row, bool row_replaces_last,
                                     std::string* note) {
  std::string earlier;  // the header and the rows before the last, as the file holds them
  const bool keep_beside = end_offset_ > most_bytes_;
  bool last_kept_beside = false;
  if (keep_beside) {
    // A last line a failed write left unfinished does not go with the kept file.
    if (!last_written_ && ::ftruncate(fd_, last_row_offset_) == 0) end_offset_ = last_row_offset_;
    // The kept file has the last row when it was written whole; the new one starts with `row`.
    last_kept_beside = last_written_;
    row_replaces_last = row_replaces_last && !last_written_;
  } else {
    absl::StatusOr<std::string> read = ReadAll(fd_, last_row_offset_, path_);
    if (!read.ok()) return read.status();
    earlier = *std::move(read);
  }
  MetricsCsvText written = RewriteMetricsCsv(earlier, columns);
  if (last_.has_value() && !row_replaces_last && !last_kept_beside) {
    written.text += MetricsCsvLine(written.columns, *last_);
  }
  written.last_row_offset = static_cast<int64_t>(written.text.size());
  written.text += MetricsCsvLine(written.columns, row);
  written.last = row;
  if (keep_beside) return ReplaceKeepingBeside(end_offset_, std::move(written), note);
  return Replace(std::move(written));
}

absl::Status CsvMetricsFile::RewriteLast() {
  last_written_ = false;  // until its line is whole again
  if (::ftruncate(fd_, last_row_offset_) != 0 || ::lseek(fd_, last_row_offset_, SEEK_SET) < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot rewrite the last row of '", path_, "': ", std::strerror(errno)));
  }
  const std::string line = MetricsCsvLine(columns_, *last_);
  if (absl::Status s = WriteAll(fd_, line, path_); !s.ok()) return s;
  end_offset_ = last_row_offset_ + static_cast<int64_t>(line.size());
  last_written_ = true;
  return absl::OkStatus();
}

absl::Status CsvMetricsFile::Append() {
  // The row before is whole: the file's consistent part now ends where this one starts.
  last_row_offset_ = end_offset_;
  last_written_ = false;
  if (::lseek(fd_, end_offset_, SEEK_SET) < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot append to '", path_, "': ", std::strerror(errno)));
  }
  const std::string line = MetricsCsvLine(columns_, *last_);
  if (absl::Status s = WriteAll(fd_, line, path_); !s.ok()) return s;
  end_offset_ += static_cast<int64_t>(line.size());
  last_written_ = true;
  return absl::OkStatus();
}

absl::Status CsvMetricsFile::Add(const std::string& name, double value, int64_t step, int64_t epoch,
                                 std::string* note) {
  const bool new_column = std::find(columns_.begin(), columns_.end(), name) == columns_.end();
  const bool same_row = last_.has_value() && last_->step == step && last_->values.count(name) == 0;
  MetricsCsvRow row = same_row ? *last_ : MetricsCsvRow{step, epoch, {}};
  row.values[name] = value;
  row.epoch = epoch;
  if (!new_column && last_written_) {
    last_ = std::move(row);
    return same_row ? RewriteLast() : Append();
  }
  // A new column changes every line, and a last row a failed write left unfinished must be
  // written again: the file is written anew, its rows read back from the file itself.
  std::vector<std::string> columns = columns_;
  if (new_column) columns.insert(std::upper_bound(columns.begin(), columns.end(), name), name);
  return Rewrite(columns, row, /*row_replaces_last=*/same_row, note);
}

}  // namespace dtrain
