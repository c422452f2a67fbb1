// RankTiming: where training's wall time went on each rank: its own work, and of that the time
// waiting for the other ranks' gradients (the communication backward did not hide, and the lead
// of a faster rank over a slower one); what no rank spent is the coordinator's, driving the
// steps between the ranks' batches. One line in the job log once fit ends ("time by rank: ..."),
// and for streamed data the time the steps waited for samples (a line saying the job is
// input-bound when that is more than a tenth of a rank's step time) and the samples skipped.
// A second line profiles a rank's mean batch by phase ("time per batch by rank: ..."): data,
// forward, backward, averaging the gradients, optimizer, and the rest (the step's bookkeeping),
// the breakdown Lightning's SimpleProfiler gives. Where the workers' kernels say so, the first line
// also gives each rank's time runnable while other threads or processes held its core, and a
// warning follows when that is a large share: cores shared with other work, which a step's phases
// cannot show (each phase only runs slower).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <utility>

#include "coordinator/jobs/trainer_callback.h"

namespace dtrain {

class RankTiming final : public TrainerCallback {
 public:
  // The share of a rank's step time waiting for its core above which the log warns.
  static constexpr double kCoreShareWarning = 0.05;

  absl::Status OnTrainBatchesEnd(TrainerControl& trainer, const TrainBatches& batches) override;
  absl::Status OnTrainEnd(TrainerControl& trainer) override;

 private:
  struct Seconds {
    double in_steps = 0;
    double gradients = 0;  // waiting for the others' gradients
    double data = 0;       // waiting for streamed samples
    StepPhaseSeconds phases;
    int64_t batches = 0;
    std::optional<double> core_wait;  // runnable while other work held the step's core
  };
  std::map<int, Seconds> seconds_;
  std::map<int, int64_t> skipped_;  // per rank, the latest count (the worker's is cumulative)
};

}  // namespace dtrain
