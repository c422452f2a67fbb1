#include "coordinator/jobs/prediction_writer.h"

#include <algorithm>
#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/csv_cell.h"
#include "common/status_macros.h"

namespace dtrain {
namespace {

// The batch's outputs rebuilt as predict_step returned them, their tensors written to `out`.
absl::StatusOr<PickleValue> Rebuild(const PredictedBatch& batch, TorchSaveWriter& out) {
  const std::string& type = batch.output_type;
  if (type == "tensor") {
    if (batch.outputs.size() != 1) {
      return absl::DataLossError(absl::StrCat("predict_step returned a tensor, but ",
                                              batch.outputs.size(), " outputs arrived"));
    }
    return out.AddTensor(batch.outputs.begin()->second);
  }
  if (type == "list" || type == "tuple") {
    // Named "0", "1", ... by position; the map orders them as text.
    std::vector<std::pair<int64_t, const HostTensor*>> items;
    for (const auto& [name, tensor] : batch.outputs) {
      int64_t position = 0;
      if (!absl::SimpleAtoi(name, &position)) {
        return absl::DataLossError(
            absl::StrCat("predict_step's ", type, " output has item '", name, "', not a position"));
      }
      items.emplace_back(position, &tensor);
    }
    std::sort(items.begin(), items.end());
    for (size_t i = 0; i < items.size(); ++i) {
      if (items[i].first != static_cast<int64_t>(i)) {
        return absl::DataLossError(absl::StrCat("predict_step's ", type, " output lacks item ", i));
      }
    }
    std::vector<PickleValue> values;
    for (const auto& item : items) {
      DTRAIN_ASSIGN_OR_RETURN(PickleValue v, out.AddTensor(*item.second));
      values.push_back(std::move(v));
    }
    return type == "list" ? PickleValue::List(std::move(values))
                          : PickleValue::Tuple(std::move(values));
  }
  std::vector<std::pair<std::string, PickleValue>> items;
  for (const auto& [name, tensor] : batch.outputs) {
    DTRAIN_ASSIGN_OR_RETURN(PickleValue v, out.AddTensor(tensor));
    items.emplace_back(name, std::move(v));
  }
  return PickleValue::Dict(std::move(items));
}

}  // namespace

absl::Status PredictionWriter::OnPredictBatch(TrainerControl& trainer,
                                              const PredictedSamples& batch) {
  if (batch.batch.outputs.empty()) return absl::OkStatus();  // on_error: skip lost it whole
  if (tensors_ == nullptr) {
    DTRAIN_ASSIGN_OR_RETURN(tensors_, TorchSaveWriter::Create(dir_ + "/predictions.pt"));
  }
  DTRAIN_ASSIGN_OR_RETURN(PickleValue value, Rebuild(batch.batch, *tensors_));
  entries_[{batch.batch_idx, batch.rank}] = Entry{std::move(value), batch.indices};
  // The outputs with one value per sample are the CSV's columns (the zoo's "label"; a
  // [batch, classes] "logits" has no single value and is left out).
  const std::vector<int64_t>& indices = batch.indices;
  for (const auto& [name, t] : batch.batch.outputs) {
    if (t.shape.size() != 1 || t.shape[0] != static_cast<int64_t>(indices.size())) continue;
    if (t.dtype != v1::DTYPE_INT64 && t.dtype != v1::DTYPE_FLOAT32) continue;
    columns_.insert(name);
    const std::vector<int64_t> ints =
        t.dtype == v1::DTYPE_INT64 ? t.ToVector<int64_t>() : std::vector<int64_t>();
    const std::vector<float> floats =
        t.dtype == v1::DTYPE_FLOAT32 ? t.ToVector<float>() : std::vector<float>();
    for (size_t k = 0; k < indices.size(); ++k) {
      rows_[indices[k]][name] = ints.empty() ? absl::StrCat(floats[k]) : absl::StrCat(ints[k]);
    }
  }
  return absl::OkStatus();
}

absl::Status PredictionWriter::WriteTensors(TrainerControl& trainer) {
  std::vector<PickleValue> outputs;
  std::vector<PickleValue> indices;
  int64_t samples = 0;
  for (auto& [key, entry] : entries_) {
    outputs.push_back(std::move(entry.value));
    std::vector<PickleValue> rows;
    for (int64_t i : entry.indices) rows.push_back(PickleValue::Int(i));
    samples += static_cast<int64_t>(rows.size());
    indices.push_back(PickleValue::List(std::move(rows)));
  }
  const int64_t batches = static_cast<int64_t>(outputs.size());
  entries_.clear();
  if (tensors_ == nullptr) {
    DTRAIN_ASSIGN_OR_RETURN(tensors_, TorchSaveWriter::Create(dir_ + "/predictions.pt"));
  }
  absl::Status written = tensors_->Finish(PickleValue::List(std::move(outputs)));
  tensors_.reset();
  DTRAIN_RETURN_IF_ERROR(written);
  const std::string indices_path = dir_ + "/batch_indices.pt";
  DTRAIN_ASSIGN_OR_RETURN(std::unique_ptr<TorchSaveWriter> index_file,
                          TorchSaveWriter::Create(indices_path));
  DTRAIN_RETURN_IF_ERROR(index_file->Finish(PickleValue::List(std::move(indices))));
  trainer.Log(absl::StrCat("predictions of ", batches, " batches (", samples,
                           " samples) written to ", dir_,
                           "/predictions.pt, their sample "
                           "indices to ",
                           indices_path));
  trainer.ReportPredictions(dir_ + "/predictions.pt");
  trainer.ReportPredictions(indices_path);
  return absl::OkStatus();
}

absl::Status PredictionWriter::WriteCsv(TrainerControl& trainer) {
  const std::string path = dir_ + "/predictions.csv";
  std::ofstream out(path, std::ios::trunc);
  out << "index";
  for (const std::string& c : columns_) out << "," << CsvCell(c);
  out << "\n";
  for (const auto& [index, values] : rows_) {
    out << index;
    for (const std::string& c : columns_) {
      auto it = values.find(c);
      out << "," << (it == values.end() ? "" : it->second);
    }
    out << "\n";
  }
  out.close();  // complete on disk before it is reported (and stored for download)
  if (!out) return absl::FailedPreconditionError(absl::StrCat("cannot write '", path, "'"));
  trainer.Log(absl::StrCat("predictions for ", rows_.size(), " samples written to ", path));
  // Reported last: the job's predictions file stays the CSV, as before predictions.pt.
  trainer.ReportPredictions(path);
  return absl::OkStatus();
}

absl::Status PredictionWriter::OnPredictEnd(TrainerControl& trainer) {
  DTRAIN_RETURN_IF_ERROR(WriteTensors(trainer));
  return WriteCsv(trainer);
}

}  // namespace dtrain
