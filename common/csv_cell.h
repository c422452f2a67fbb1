// CSV cells for the files users open in spreadsheets and pandas (metrics.csv, predictions.csv),
// written as RFC 4180 quotes them and guarded against formula injection: a name that model code
// chose (a logged metric, a prediction output) must not run as a formula when the file is opened.
// Hand-written: a dozen lines, where a CSV library would add a dependency for one rule.
#pragma once

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace dtrain {

// `text` as one cell: a leading ', when it starts with one of = + - @ tab CR or ' itself (OWASP's
// guard; spreadsheets show the rest as text), then quoted, its quotes doubled, when it holds a
// comma, a quote or a line break. Use it for names, not for numbers ("-0.5" would gain a ').
std::string CsvCell(absl::string_view text);

// One line's cells, read back as CsvCell wrote them: quotes removed, doubled quotes single, the
// guard's leading ' dropped. A line with no quotes splits on commas as before.
std::vector<std::string> SplitCsvLine(absl::string_view line);

// The next record of `*text` (without its line break) and `*text` moved past it. A line break
// inside quotes belongs to the record, as CsvCell writes a name that holds one; a record whose
// quote never closes runs to the end of the text (a file cut short).
absl::string_view NextCsvRecord(absl::string_view* text);

}  // namespace dtrain
