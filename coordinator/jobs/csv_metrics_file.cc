#include "coordinator/jobs/csv_metrics_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

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

}  // namespace

absl::StatusOr<std::unique_ptr<CsvMetricsFile>> CsvMetricsFile::Open(const std::string& path,
                                                                     bool append) {
  std::unique_ptr<CsvMetricsFile> file(new CsvMetricsFile(path));
  file->columns_ = {"epoch", "step"};
  if (append && std::ifstream(path).good()) {
    if (absl::Status s = file->Load(); !s.ok()) return s;
  }
  if (absl::Status s = file->RewriteAll(); !s.ok()) return s;
  return file;
}

CsvMetricsFile::~CsvMetricsFile() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status CsvMetricsFile::Load() {
  std::ifstream in(path_);
  std::string header;
  if (!std::getline(in, header)) return absl::OkStatus();
  const std::vector<std::string> names = SplitCsvLine(header);
  const bool long_form = header == "wall_time,step,epoch,name,value";
  for (std::string line; std::getline(in, line);) {
    const std::vector<std::string> cells = SplitCsvLine(line);
    if (cells.size() != names.size()) continue;  // a line cut short by a crash
    if (long_form) {
      int64_t step = 0, epoch = 0;
      double value = 0;
      if (!absl::SimpleAtoi(cells[1], &step) || !absl::SimpleAtoi(cells[2], &epoch) ||
          !absl::SimpleAtod(cells[4], &value)) {
        continue;
      }
      if (rows_.empty() || rows_.back().step != step || rows_.back().values.count(cells[3])) {
        rows_.push_back(Row{step, epoch, {}});
      }
      rows_.back().values[cells[3]] = value;
      continue;
    }
    Row row;
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
    rows_.push_back(std::move(row));
  }
  for (const Row& row : rows_) {
    for (const auto& [name, value] : row.values) {
      if (std::find(columns_.begin(), columns_.end(), name) == columns_.end()) {
        columns_.push_back(name);
      }
    }
  }
  std::sort(columns_.begin(), columns_.end());
  return absl::OkStatus();
}

std::string CsvMetricsFile::Header() const {
  std::vector<std::string> cells;
  for (const std::string& column : columns_) cells.push_back(CsvCell(column));
  return absl::StrJoin(cells, ",") + "\n";
}

std::string CsvMetricsFile::Line(const Row& row) const {
  std::vector<std::string> cells;
  cells.reserve(columns_.size());
  for (const std::string& column : columns_) {
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

absl::Status CsvMetricsFile::RewriteAll() {
  std::string text = Header();
  int64_t last_start = static_cast<int64_t>(text.size());
  for (const Row& row : rows_) {
    last_start = static_cast<int64_t>(text.size());
    text += Line(row);
  }
  absl::StatusOr<int> opened = WriteFileAtomicallyKeepOpen(path_, text);
  if (!opened.ok()) return opened.status();
  const int fd = *opened;
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
  last_row_offset_ = last_start;
  end_offset_ = static_cast<int64_t>(text.size());
  return absl::OkStatus();
}

absl::Status CsvMetricsFile::RewriteLast() {
  if (::ftruncate(fd_, last_row_offset_) != 0 || ::lseek(fd_, last_row_offset_, SEEK_SET) < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot rewrite the last row of '", path_, "': ", std::strerror(errno)));
  }
  const std::string line = Line(rows_.back());
  if (absl::Status s = WriteAll(fd_, line, path_); !s.ok()) return s;
  end_offset_ = last_row_offset_ + static_cast<int64_t>(line.size());
  return absl::OkStatus();
}

absl::Status CsvMetricsFile::Append() {
  if (::lseek(fd_, end_offset_, SEEK_SET) < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot append to '", path_, "': ", std::strerror(errno)));
  }
  const std::string line = Line(rows_.back());
  if (absl::Status s = WriteAll(fd_, line, path_); !s.ok()) return s;
  last_row_offset_ = end_offset_;
  end_offset_ += static_cast<int64_t>(line.size());
  return absl::OkStatus();
}

absl::Status CsvMetricsFile::Add(const std::string& name, double value, int64_t step,
                                 int64_t epoch) {
  const bool new_column = std::find(columns_.begin(), columns_.end(), name) == columns_.end();
  if (new_column) {
    columns_.push_back(name);
    std::sort(columns_.begin(), columns_.end());
  }
  const bool same_row =
      !rows_.empty() && rows_.back().step == step && rows_.back().values.count(name) == 0;
  if (same_row) {
    rows_.back().values[name] = value;
    rows_.back().epoch = epoch;
  } else {
    rows_.push_back(Row{step, epoch, {{name, value}}});
  }
  if (new_column) return RewriteAll();
  return same_row ? RewriteLast() : Append();
}

}  // namespace dtrain
