#include "common/csv_cell.h"

#include "absl/strings/str_cat.h"

namespace dtrain {
namespace {

bool Guarded(char c) {
  return c == '=' || c == '+' || c == '-' || c == '@' || c == '\t' || c == '\r' || c == '\'';
}

}  // namespace

std::string CsvCell(absl::string_view text) {
  std::string cell =
      !text.empty() && Guarded(text.front()) ? absl::StrCat("'", text) : std::string(text);
  if (cell.find_first_of(",\"\n\r") == std::string::npos) return cell;
  std::string quoted = "\"";
  for (char c : cell) {
    if (c == '"') quoted += '"';
    quoted += c;
  }
  quoted += '"';
  return quoted;
}

std::vector<std::string> SplitCsvLine(absl::string_view line) {
  std::vector<std::string> cells(1);
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        cells.back() += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        cells.back() += c;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      cells.emplace_back();
    } else {
      cells.back() += c;
    }
  }
  for (std::string& cell : cells) {
    if (cell.size() > 1 && cell.front() == '\'' && Guarded(cell[1])) cell.erase(0, 1);
  }
  return cells;
}

absl::string_view NextCsvRecord(absl::string_view* text) {
  bool quoted = false;
  for (size_t i = 0; i < text->size(); ++i) {
    const char c = (*text)[i];
    // A doubled quote inside quotes toggles twice: no special case needed.
    if (c == '"') quoted = !quoted;
    if (c == '\n' && !quoted) {
      const absl::string_view record = text->substr(0, i);
      text->remove_prefix(i + 1);
      return record;
    }
  }
  const absl::string_view record = *text;
  text->remove_prefix(text->size());
  return record;
}

}  // namespace dtrain
