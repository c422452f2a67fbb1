#include "coordinator/jobs/model_checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/checkpoint_filename.h"
#include "common/file_reference.h"
#include "common/status_macros.h"
#include "coordinator/jobs/monitored_metric.h"

namespace dtrain {

ModelCheckpoint::ModelCheckpoint(v1::CheckpointConfig config, const std::vector<v1::JobFile>& kept)
    : config_(std::move(config)) {
  if (config_.monitor().empty()) return;
  for (const v1::JobFile& file : kept) {
    if (file.kind() == "checkpoint" && file.has_monitored()) {
      top_k_.emplace_back(file.monitored(), file.name());
    }
  }
  std::stable_sort(top_k_.begin(), top_k_.end(),
                   [&](const auto& a, const auto& b) { return Better(a.first, b.first); });
}

bool ModelCheckpoint::Better(double a, double b) const {
  return config_.mode() == "max" ? a > b : a < b;
}

absl::Status ModelCheckpoint::OnTrainBatchesEnd(TrainerControl& trainer,
                                                const TrainBatches& batches) {
  for (const auto& [name, value] : batches.epoch_logged) train_values_[name] = value;
  const int64_t every = config_.every_n_steps();
  if (every > 0 && trainer.global_step() / every != batches.step_before / every) {
    DTRAIN_RETURN_IF_ERROR(trainer.SaveCheckpoint({kLastName, {}, std::nullopt}));
  }
  // As Lightning's: without a validation loop, the epoch's checkpoint comes at its end.
  if (batches.epoch_end && trainer.state().stage == "fit" && ValidationOff(trainer)) {
    return SaveForEpoch(trainer, {});
  }
  return absl::OkStatus();
}

absl::Status ModelCheckpoint::OnValidationEnd(TrainerControl& trainer,
                                              const ValidationMetrics& metrics) {
  // Only fit writes checkpoints (Lightning's ModelCheckpoint skips trainer.validate).
  if (trainer.state().stage != "fit") return absl::OkStatus();
  return SaveForEpoch(trainer, metrics.overall);
}

absl::Status ModelCheckpoint::SaveForEpoch(TrainerControl& trainer,
                                           const std::map<std::string, double>& validation) {
  const int every_epochs = config_.every_n_epochs();
  if (every_epochs > 0 && (trainer.epoch() + 1) % every_epochs != 0) return absl::OkStatus();
  if (config_.monitor().empty()) return trainer.SaveCheckpoint({kLastName, {}, std::nullopt});
  // Every value a filename may name: the validation's, then the training epoch's.
  std::map<std::string, double> values = validation;
  values.insert(train_values_.begin(), train_values_.end());
  DTRAIN_ASSIGN_OR_RETURN(const double value,
                          MonitoredValue(values, config_.monitor(), "checkpoint"));
  const int k = config_.save_top_k();
  if (k == 0) return absl::OkStatus();
  const bool qualifies =
      k < 0 || static_cast<int>(top_k_.size()) < k || Better(value, top_k_.back().first);
  if (!qualifies) return absl::OkStatus();
  values["epoch"] = static_cast<double>(trainer.epoch());
  values["step"] = static_cast<double>(trainer.global_step());
  const std::string name = FormatCheckpointFilename(
      config_.filename(), values,
      !config_.has_auto_insert_metric_name() || config_.auto_insert_metric_name());
  std::vector<std::pair<double, std::string>> next = top_k_;
  // The same name again (a resumed run validating where it stopped, or a template without
  // {step}) replaces its file.
  next.erase(
      std::remove_if(next.begin(), next.end(), [&](const auto& e) { return e.second == name; }),
      next.end());
  next.emplace_back(value, name);
  std::stable_sort(next.begin(), next.end(),
                   [&](const auto& a, const auto& b) { return Better(a.first, b.first); });
  std::vector<std::string> evict;
  while (k > 0 && static_cast<int>(next.size()) > k) {
    evict.push_back(next.back().second);
    next.pop_back();
  }
  DTRAIN_RETURN_IF_ERROR(trainer.SaveCheckpoint({name, evict, value}));
  top_k_ = std::move(next);
  trainer.SetBestCheckpoint(top_k_.front().second);
  return absl::OkStatus();
}

absl::Status ModelCheckpoint::OnTrainEnd(TrainerControl& trainer) {
  return trainer.SaveCheckpoint({kLastName, {}, std::nullopt});
}

std::vector<std::string> ModelCheckpoint::Siblings(const std::string& path) {
  // An uploaded checkpoint has no directory; a worker path's is seen here only on a shared
  // filesystem (then its siblings are worker paths too, written plainly).
  if (IsArtifactReference(path)) return {};
  if (IsWorkerPath(path)) return Siblings(WithoutWorkerMark(path));
  std::vector<std::pair<std::filesystem::file_time_type, std::string>> found;
  std::error_code error;
  const std::filesystem::path target(path);
  for (const auto& entry : std::filesystem::directory_iterator(target.parent_path(), error)) {
    if (entry.path().extension() != ".ckpt" || entry.path() == target) continue;
    found.emplace_back(entry.last_write_time(error), entry.path().string());
  }
  std::sort(found.begin(), found.end(), std::greater<>());
  std::vector<std::string> out;
  for (auto& [time, name] : found) out.push_back(std::move(name));
  return out;
}

}  // namespace dtrain
