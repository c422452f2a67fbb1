#include "bench/collectives_runner.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench/percentile.h"
#include "common/process_tuning.h"

ABSL_FLAG(std::string, coordinator, "127.0.0.1:29610", "coordinator host:port");
ABSL_FLAG(std::string, group, "bench", "group id");
ABSL_FLAG(int, world_size, 2, "ranks in the run");
ABSL_FLAG(int, barriers, 2000, "timed barriers");
ABSL_FLAG(std::string, sizes, "4096,1048576,16777216,67108864", "sizes in bytes (a rank's)");
ABSL_FLAG(double, seconds_per_size, 3.0, "time budget per collective and size");

namespace dtrain::bench {
namespace {

struct Row {
  std::string op;
  int64_t bytes;
  std::vector<double> us;
};

// Times `call` once, in microseconds.
absl::StatusOr<double> Timed(const std::function<absl::Status()>& call) {
  const absl::Time start = absl::Now();
  if (absl::Status s = call(); !s.ok()) return s;
  return absl::ToDoubleMicroseconds(absl::Now() - start);
}

}  // namespace

CollectivesPlan PlanFromFlags() {
  return {absl::GetFlag(FLAGS_barriers), absl::GetFlag(FLAGS_sizes),
          absl::GetFlag(FLAGS_seconds_per_size)};
}

std::string CoordinatorFromFlags() { return absl::GetFlag(FLAGS_coordinator); }

void InitBench(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  TuneProcessForDtrain();
}

std::unique_ptr<ProcessGroup> JoinOrExit() {
  ProcessGroupOptions options;
  options.group = absl::GetFlag(FLAGS_group);
  options.world_size = absl::GetFlag(FLAGS_world_size);
  options.register_timeout = absl::Seconds(60);
  auto joined = ProcessGroup::Join(CoordinatorFromFlags(), options);
  if (!joined.ok()) {
    std::fprintf(stderr, "join: %s\n", joined.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(*joined);
}

int RunCollectivesBench(const CollectiveOps& ops, const CollectivesPlan& plan) {
  auto fail = [&](const absl::Status& s) {
    std::fprintf(stderr, "%s rank %d: %s\n", ops.system.c_str(), ops.rank, s.ToString().c_str());
    return 1;
  };
  std::vector<Row> rows;
  for (int i = 0; i < 100; ++i) {
    if (absl::Status s = ops.barrier(); !s.ok()) return fail(s);
  }
  Row barrier{"barrier", 0, {}};
  for (int i = 0; i < plan.barriers; ++i) {
    absl::StatusOr<double> us = Timed(ops.barrier);
    if (!us.ok()) return fail(us.status());
    barrier.us.push_back(*us);
  }
  rows.push_back(std::move(barrier));

  for (absl::string_view size_text : absl::StrSplit(plan.sizes, ',')) {
    int64_t bytes = 0;
    if (!absl::SimpleAtoi(size_text, &bytes) || bytes < 4) {
      return fail(absl::InvalidArgumentError(absl::StrCat("bad size '", size_text, "'")));
    }
    if (absl::Status s = ops.prepare(bytes); !s.ok()) return fail(s);
    const std::pair<const char*, const std::function<absl::Status()>*> timed[] = {
        {"all_reduce", &ops.all_reduce},
        {"broadcast", &ops.broadcast},
        {"all_gather", &ops.all_gather}};
    for (const auto& [op, call] : timed) {
      absl::StatusOr<double> once = Timed(*call);  // warm-up (connections, buffers)
      if (once.ok()) once = Timed(*call);
      if (!once.ok()) return fail(once.status());
      absl::StatusOr<int> iters = ops.agree(std::clamp(
          static_cast<int>(plan.seconds_per_size / std::max(1e-6, *once * 1e-6)), 5, 2000));
      if (!iters.ok()) return fail(iters.status());
      Row row{op, bytes, {}};
      for (int i = 0; i < *iters; ++i) {
        absl::StatusOr<double> us = Timed(*call);
        if (!us.ok()) return fail(us.status());
        row.us.push_back(*us);
      }
      rows.push_back(std::move(row));
    }
  }
  if (ops.rank == 0) {
    for (const Row& row : rows) {
      const double p50 = Percentile(row.us, 0.5);
      const double algbw = row.bytes > 0 ? row.bytes / (p50 * 1e-6) / 1e9 : 0.0;
      std::printf(
          "{\"system\": \"%s\", \"op\": \"%s\", \"ranks\": %d, \"bytes\": %lld, "
          "\"p50_us\": %.1f, \"p99_us\": %.1f, \"algbw_gbps\": %.4f}\n",
          ops.system.c_str(), row.op.c_str(), ops.world_size, static_cast<long long>(row.bytes),
          p50, Percentile(row.us, 0.99), algbw);
    }
    std::fflush(stdout);
  }
  return ops.barrier().ok() ? 0 : 1;
}

}  // namespace dtrain::bench
