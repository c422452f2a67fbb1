// The timing loop shared by the collectives benchmarks of every dtrain backend: warm-up, timed
// barriers, then for each size in-place all_reduces, broadcasts from rank 0 and all_gathers of
// that many bytes a rank, each for a time budget (every rank runs the same iteration count,
// agreed from rank 0's probe). Rank 0 prints one JSON object per row:
// {"system","op","ranks","bytes","p50_us","p99_us","algbw_gbps"}.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/process_group.h"

namespace dtrain::bench {

struct CollectiveOps {
  std::string system;  // the row's "system"
  int rank = 0;
  int world_size = 1;
  std::function<absl::Status()> barrier;
  // Prepares a float32 buffer of `bytes` for the all_reduces that follow.
  std::function<absl::Status(int64_t bytes)> prepare;
  // Sums the prepared buffer over ranks, in place.
  std::function<absl::Status()> all_reduce;
  // Overwrites the prepared buffer with rank 0's; gathers every rank's prepared buffer.
  std::function<absl::Status()> broadcast;
  std::function<absl::Status()> all_gather;
  // Rank 0's value of an integer, on every rank.
  std::function<absl::StatusOr<int>(int)> agree;
};

struct CollectivesPlan {
  int barriers = 2000;
  std::string sizes = "4096,1048576,16777216,67108864";
  double seconds_per_size = 3.0;
};

// Parses the command line and tunes the process as our binaries are; then the plan and the
// group from the benchmark's flags (--coordinator, --group, --world_size, --barriers, --sizes,
// --seconds_per_size). JoinOrExit exits 1 with the reason if the group cannot form.
void InitBench(int argc, char** argv);
CollectivesPlan PlanFromFlags();
std::string CoordinatorFromFlags();
std::unique_ptr<ProcessGroup> JoinOrExit();

// Runs the plan; returns the process exit code (a failing collective is printed to stderr).
int RunCollectivesBench(const CollectiveOps& ops, const CollectivesPlan& plan);

}  // namespace dtrain::bench
