// dtrain-collectives-demo: a small program built on the client library, one rank per process.
// It shows the API a worker (or a user's own program) uses: join a group, then barrier,
// broadcast, all_reduce, all_gather and reduce_boolean_decision with deadlines.
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_join.h"
#include "client/process_group.h"
#include "common/process_tuning.h"

ABSL_FLAG(std::string, coordinator, "127.0.0.1:29610", "coordinator host:port");
ABSL_FLAG(std::string, group, "demo", "group (job) id");
ABSL_FLAG(int, world_size, 2, "number of ranks");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  dtrain::TuneProcessForDtrain();
  dtrain::ProcessGroupOptions options;
  options.group = absl::GetFlag(FLAGS_group);
  options.world_size = absl::GetFlag(FLAGS_world_size);
  options.collective_timeout = absl::Seconds(30);
  auto joined = dtrain::ProcessGroup::Join(absl::GetFlag(FLAGS_coordinator), options);
  if (!joined.ok()) {
    std::fprintf(stderr, "join failed: %s\n", joined.status().ToString().c_str());
    return 1;
  }
  dtrain::ProcessGroup& pg = **joined;
  auto check = [&](const absl::Status& s, const char* what) {
    if (s.ok()) return true;
    std::fprintf(stderr, "rank %d: %s failed: %s\n", pg.rank(), what, s.ToString().c_str());
    return false;
  };

  if (!check(pg.Barrier("start"), "barrier")) return 1;
  std::string greeting = "hello from rank 0";
  auto bytes = pg.BroadcastBytes(0, pg.rank() == 0 ? &greeting : nullptr);
  if (!check(bytes.status(), "broadcast")) return 1;

  // Each rank contributes [rank, rank + 1, rank + 2]; the sum over ranks is exact in float32.
  const float r = static_cast<float>(pg.rank());
  auto mine =
      dtrain::HostTensor::FromVector<float>(dtrain::v1::DTYPE_FLOAT32, {3}, {r, r + 1, r + 2});
  auto sum = pg.AllReduce(mine, dtrain::v1::REDUCE_OP_SUM);
  if (!check(sum.status(), "all_reduce")) return 1;
  auto gathered = pg.AllGather(mine);
  if (!check(gathered.status(), "all_gather")) return 1;
  auto stop = pg.ReduceBooleanDecision(pg.rank() == 0, /*all=*/false);
  if (!check(stop.status(), "reduce_boolean_decision")) return 1;

  std::vector<float> s = sum->ToVector<float>();
  std::printf(
      "rank %d/%d (local rank %d, node %d, generation %lld): broadcast '%s', "
      "all_reduce sum [%s], all_gather %zu parts, any-stop %s\n",
      pg.rank(), pg.world_size(), pg.local_rank(), pg.node_rank(),
      static_cast<long long>(pg.generation()), bytes->c_str(), absl::StrJoin(s, ", ").c_str(),
      gathered->size(), *stop ? "true" : "false");
  return check(pg.Barrier("end"), "barrier") ? 0 : 1;
}
