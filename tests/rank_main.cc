// dtrain-test-rank: one rank in its own process, for tests that kill a member. Joins a group,
// prints "rank <r>" on stdout, then does what --action says and waits to be killed.
#include <unistd.h>

#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "client/process_group.h"
#include "common/channel.h"
#include "common/process_tuning.h"

ABSL_FLAG(std::string, coordinator, "", "host:port");
ABSL_FLAG(std::string, group, "", "group id");
ABSL_FLAG(int, world_size, 1, "world size");
ABSL_FLAG(std::string, host, "victim", "host name to register with");
ABSL_FLAG(std::string, action, "idle", "idle | barrier | all_reduce: what to be doing when killed");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  dtrain::TuneProcessForDtrain();
  dtrain::ProcessGroupOptions options;
  options.group = absl::GetFlag(FLAGS_group);
  options.world_size = absl::GetFlag(FLAGS_world_size);
  options.host = absl::GetFlag(FLAGS_host);
  auto pg = dtrain::ProcessGroup::Join(absl::GetFlag(FLAGS_coordinator), options);
  if (!pg.ok()) {
    std::printf("error %s\n", pg.status().ToString().c_str());
    return 1;
  }
  std::printf("rank %d\n", (*pg)->rank());
  std::fflush(stdout);
  const std::string action = absl::GetFlag(FLAGS_action);
  absl::Status status;
  if (action == "barrier") {
    status = (*pg)->Barrier("doomed");
  } else if (action == "all_reduce") {
    auto t = dtrain::HostTensor::Zeros(dtrain::v1::DTYPE_FLOAT32, {1 << 20});
    status = (*pg)->AllReduce(*t, dtrain::v1::REDUCE_OP_SUM).status();
  }
  std::printf("done %s\n", status.ToString().c_str());
  std::fflush(stdout);
  pause();  // wait to be killed
  return 0;
}
