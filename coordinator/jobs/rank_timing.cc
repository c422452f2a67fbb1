#include "coordinator/jobs/rank_timing.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace dtrain {

absl::Status RankTiming::OnTrainBatchesEnd(TrainerControl& trainer, const TrainBatches& batches) {
  if (batches.result == nullptr) return absl::OkStatus();
  for (const RankTrainResult& rank : batches.result->ranks) {
    Seconds& s = seconds_[rank.rank];
    s.in_steps += rank.step_seconds;
    s.gradients += rank.gradient_wait_seconds;
    s.data += rank.data_wait_seconds;
    s.phases += rank.phases;
    s.batches += static_cast<int64_t>(rank.batches.size());
    if (rank.core_wait_seconds.has_value()) {
      s.core_wait = s.core_wait.value_or(0) + *rank.core_wait_seconds;
    }
    skipped_[rank.rank] = rank.data_skipped;
  }
  return absl::OkStatus();
}

absl::Status RankTiming::OnTrainEnd(TrainerControl& trainer) {
  if (seconds_.empty()) return absl::OkStatus();
  // A line names at most this many ranks, then says how many more it left out.
  static constexpr size_t kLoggedRanks = 8;
  auto joined = [](const std::vector<std::string>& parts) {
    std::vector<std::string> shown(parts.begin(),
                                   parts.begin() + std::min(parts.size(), kLoggedRanks));
    if (parts.size() > kLoggedRanks) {
      shown.push_back(absl::StrCat("and ", parts.size() - kLoggedRanks, " more"));
    }
    return absl::StrJoin(shown, "; ");
  };
  std::vector<std::string> parts, profiles;
  double busiest = 0;
  double most_data_share = 0;
  int input_bound_rank = -1;
  double most_core_share = 0;
  int core_bound_rank = -1;
  for (const auto& [rank, s] : seconds_) {
    busiest = std::max(busiest, s.in_steps);
    const double data_share = s.in_steps > 0 ? s.data / s.in_steps : 0.0;
    if (data_share > most_data_share) {
      most_data_share = data_share;
      input_bound_rank = rank;
    }
    parts.push_back(absl::StrCat(
        absl::StrFormat("rank %d %.2f s in steps, %.2f s (%.1f%%) of it waiting for gradients",
                        rank, s.in_steps, s.gradients,
                        s.in_steps > 0 ? 100 * s.gradients / s.in_steps : 0.0),
        s.data > 0 ? absl::StrFormat(", %.2f s (%.1f%%) for data", s.data, 100 * data_share) : "",
        s.core_wait.has_value()
            ? absl::StrFormat(", %.2f s (%.1f%%) for its core", *s.core_wait,
                              s.in_steps > 0 ? 100 * *s.core_wait / s.in_steps : 0.0)
            : ""));
    const double core_share = s.in_steps > 0 ? s.core_wait.value_or(0) / s.in_steps : 0.0;
    if (core_share > most_core_share) {
      most_core_share = core_share;
      core_bound_rank = rank;
    }
    // The profile, from workers that report phases (older ones do not).
    const StepPhaseSeconds& p = s.phases;
    if (p.total() <= 0 || s.batches == 0) continue;
    const double ms = 1000.0 / static_cast<double>(s.batches);
    profiles.push_back(absl::StrFormat(
        "rank %d %.3f ms: data %.3f, forward %.3f, backward %.3f, averaging gradients %.3f, "
        "optimizer %.3f, other %.3f",
        rank, s.in_steps * ms, p.data * ms, p.forward * ms, p.backward * ms, p.averaging * ms,
        p.optimizer * ms, std::max(0.0, s.in_steps - p.total()) * ms));
  }
  const TrainingState& state = trainer.state();
  const double train = absl::ToDoubleSeconds(state.phases.Get("train"));
  trainer.Log(
      absl::StrFormat("time by rank: %s; between steps (the coordinator) %.3f s of %.3f s in %s",
                      joined(parts), std::max(0.0, train - busiest), train, state.calls.Summary()));
  if (!profiles.empty()) trainer.Log(absl::StrCat("time per batch by rank: ", joined(profiles)));
  if (most_data_share > 0.1) {
    trainer.Log(absl::StrFormat(
        "input-bound: rank %d waited %.0f%% of its step time for samples; more "
        "data.num_workers (decoding threads per rank) or fewer, lighter transforms would help",
        input_bound_rank, 100 * most_data_share));
  }
  // A few percent is a service's own threads beside the steps on a machine without a spare core
  // (docs/OPERATIONS.md, "Cores"); more is another worker, job or process on the same cores.
  if (most_core_share > kCoreShareWarning) {
    trainer.Log(absl::StrFormat(
        "shared cores: rank %d's step thread waited %.0f%% of its step time for its core while "
        "other threads or processes ran there; give each worker cores of its own (the worker's "
        "--cpus, docs/OPERATIONS.md \"Cores\")",
        core_bound_rank, 100 * most_core_share));
  }
  int64_t skipped = 0;
  for (const auto& [rank, n] : skipped_) skipped += n;
  if (skipped > 0) {
    trainer.Log(absl::StrCat("skipped ", skipped,
                             " samples (data.shards.on_error: skip); each is in its worker's log "
                             "with its shard and key"));
  }
  return absl::OkStatus();
}

}  // namespace dtrain
