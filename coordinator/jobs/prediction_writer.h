// PredictionWriter, as Lightning's BasePredictionWriter, writes predict_step's outputs to the
// job's output directory:
// - predictions.pt: what Lightning's trainer.predict returns, for torch.load. It is a list with
//   one entry per batch, each as predict_step returned it (a tensor, a dict of tensors, or a
//   list or tuple of tensors), of any shape and dtype. Batches are ordered by batch index, then
//   rank, so one rank's run lists them as Lightning does.
// - batch_indices.pt: for each entry, the sample indices of its rows (BasePredictionWriter's
//   batch_indices).
// - predictions.csv: one row per sample in sample order ("index", then a column for each output
//   with one int64 or float32 value per sample).
// Tensors are written into predictions.pt as calls answer, so the coordinator holds only their
// places and indices, not the outputs.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/torch_save_writer.h"
#include "coordinator/jobs/trainer_callback.h"

namespace dtrain {

class PredictionWriter final : public TrainerCallback {
 public:
  explicit PredictionWriter(std::string dir) : dir_(std::move(dir)) {}

  absl::Status OnPredictBatch(TrainerControl& trainer, const PredictedSamples& batch) override;
  absl::Status OnPredictEnd(TrainerControl& trainer) override;

 private:
  // One predict_step output, in predictions.pt's list.
  struct Entry {
    PickleValue value;
    std::vector<int64_t> indices;
  };
  absl::Status WriteTensors(TrainerControl& trainer);
  absl::Status WriteCsv(TrainerControl& trainer);

  const std::string dir_;
  std::unique_ptr<TorchSaveWriter> tensors_;          // predictions.pt, open from the first batch
  std::map<std::pair<int64_t, int>, Entry> entries_;  // by (batch_idx, rank)
  // predictions.csv: the columns, and per sample index a value per column.
  std::set<std::string> columns_;
  std::map<int64_t, std::map<std::string, std::string>> rows_;
};

}  // namespace dtrain
