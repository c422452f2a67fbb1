// libFuzzer target: CSV cells (common/csv_cell.h) as metrics.csv and predictions.csv write them
// and as the coordinator reads metrics.csv back when a job resumes. The input is split at NUL
// bytes into cells, which CsvCell writes and SplitCsvLine must read back unchanged; the whole
// input is also read as a line. A crash, a sanitizer report, a cell that does not round-trip,
// or a written cell that starts with a formula's first character is a finding. Built and run by
// tests/fuzz/run.sh.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/csv_cell.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  (void)dtrain::SplitCsvLine(text);
  const std::vector<std::string> cells = absl::StrSplit(text, '\0');
  std::vector<std::string> written;
  for (const std::string& cell : cells) {
    written.push_back(dtrain::CsvCell(cell));
    const std::string& w = written.back();
    // OWASP's formula characters must not lead a cell, quoted or not.
    const size_t first = !w.empty() && w.front() == '"' ? 1 : 0;
    if (w.size() > first && std::string("=+-@\t\r").find(w[first]) != std::string::npos) {
      std::abort();
    }
  }
  if (dtrain::SplitCsvLine(absl::StrJoin(written, ",")) != cells) std::abort();
  return 0;
}
