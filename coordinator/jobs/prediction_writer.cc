#include "coordinator/jobs/prediction_writer.h"

#include <fstream>

#include "absl/strings/str_cat.h"

namespace dtrain {

absl::Status PredictionWriter::OnPredictEnd(TrainerControl& trainer,
                                            const PredictionRows& predictions) {
  std::ofstream out(path_, std::ios::trunc);
  out << "index";
  for (const std::string& c : predictions.columns) out << "," << c;
  out << "\n";
  for (const auto& [index, values] : predictions.rows) {
    out << index;
    for (const std::string& c : predictions.columns) {
      auto it = values.find(c);
      out << "," << (it == values.end() ? "" : it->second);
    }
    out << "\n";
  }
  out.close();  // complete on disk before it is reported (and stored for download)
  if (!out) return absl::FailedPreconditionError(absl::StrCat("cannot write '", path_, "'"));
  trainer.Log(
      absl::StrCat("predictions for ", predictions.rows.size(), " samples written to ", path_));
  trainer.ReportPredictions(path_);
  return absl::OkStatus();
}

}  // namespace dtrain
