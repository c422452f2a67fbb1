// dtrain-bench-collectives: one rank of the collectives benchmark. Every rank of a run is its
// own process (as torch.distributed's are); rank 0 prints one JSON object per measured row:
// {"system","op","ranks","bytes","p50_us","p99_us","algbw_gbps"}.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/process_group.h"
#include "common/process_tuning.h"

ABSL_FLAG(std::string, coordinator, "127.0.0.1:29610", "coordinator host:port");
ABSL_FLAG(std::string, group, "bench", "group id");
ABSL_FLAG(int, world_size, 2, "ranks in the run");
ABSL_FLAG(int, barriers, 2000, "timed barriers");
ABSL_FLAG(std::string, sizes, "4096,1048576,16777216,67108864", "all_reduce sizes in bytes");
ABSL_FLAG(double, seconds_per_size, 3.0, "time budget per all_reduce size");

namespace {

struct Row {
  std::string op;
  int64_t bytes;
  std::vector<double> us;
};

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5));
  return v[i];
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  dtrain::TuneProcessForDtrain();
  dtrain::ProcessGroupOptions options;
  options.group = absl::GetFlag(FLAGS_group);
  options.world_size = absl::GetFlag(FLAGS_world_size);
  options.register_timeout = absl::Seconds(60);
  auto joined = dtrain::ProcessGroup::Join(absl::GetFlag(FLAGS_coordinator), options);
  if (!joined.ok()) {
    std::fprintf(stderr, "join: %s\n", joined.status().ToString().c_str());
    return 1;
  }
  dtrain::ProcessGroup& pg = **joined;
  auto fail = [&](const absl::Status& s) {
    std::fprintf(stderr, "rank %d: %s\n", pg.rank(), s.ToString().c_str());
    return 1;
  };
  std::vector<Row> rows;

  for (int i = 0; i < 100; ++i) {
    if (absl::Status s = pg.Barrier("warm"); !s.ok()) return fail(s);
  }
  Row barrier{"barrier", 0, {}};
  for (int i = 0; i < absl::GetFlag(FLAGS_barriers); ++i) {
    const absl::Time start = absl::Now();
    if (absl::Status s = pg.Barrier("b"); !s.ok()) return fail(s);
    barrier.us.push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
  }
  rows.push_back(std::move(barrier));

  for (absl::string_view size_text : absl::StrSplit(absl::GetFlag(FLAGS_sizes), ',')) {
    const int64_t bytes = std::stoll(std::string(size_text));
    dtrain::HostTensor t =
        dtrain::HostTensor::Zeros(dtrain::v1::DTYPE_FLOAT32, {bytes / 4}).value();
    // In place, as torch.distributed.all_reduce (the peer) is.
    if (absl::Status s = pg.AllReduceInPlace(&t, dtrain::v1::REDUCE_OP_SUM); !s.ok()) return fail(s);
    // Every rank runs the same number of iterations: rank 0 decides from its warm-up time.
    const absl::Time probe = absl::Now();
    if (absl::Status s = pg.AllReduceInPlace(&t, dtrain::v1::REDUCE_OP_SUM); !s.ok()) return fail(s);
    const double once = std::max(1e-6, absl::ToDoubleSeconds(absl::Now() - probe));
    std::string iters_text = std::to_string(std::clamp(
        static_cast<int>(absl::GetFlag(FLAGS_seconds_per_size) / once), 5, 2000));
    auto agreed = pg.BroadcastBytes(0, pg.rank() == 0 ? &iters_text : nullptr);
    if (!agreed.ok()) return fail(agreed.status());
    const int iters = std::stoi(*agreed);
    Row row{"all_reduce", bytes, {}};
    for (int i = 0; i < iters; ++i) {
      const absl::Time start = absl::Now();
      if (absl::Status s = pg.AllReduceInPlace(&t, dtrain::v1::REDUCE_OP_SUM); !s.ok()) {
        return fail(s);
      }
      row.us.push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
    }
    rows.push_back(std::move(row));
  }
  if (pg.rank() == 0) {
    for (const Row& row : rows) {
      const double p50 = Percentile(row.us, 0.5);
      const double algbw = row.bytes > 0 ? row.bytes / (p50 * 1e-6) / 1e9 : 0.0;
      std::printf("{\"system\": \"dtrain-grpc\", \"op\": \"%s\", \"ranks\": %d, \"bytes\": %lld, "
                  "\"p50_us\": %.1f, \"p99_us\": %.1f, \"algbw_gbps\": %.4f}\n",
                  row.op.c_str(), pg.world_size(), static_cast<long long>(row.bytes), p50,
                  Percentile(row.us, 0.99), algbw);
    }
  }
  return pg.Barrier("end").ok() ? 0 : 1;
}
