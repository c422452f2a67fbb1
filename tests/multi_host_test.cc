// Four "hosts" on one machine: the coordinator and three workers, each in a network namespace
// and a UTS namespace of its own (its own address and host name), joined by a bridge; their
// addresses exist only inside those namespaces. A ddp_spawn job with two devices per worker
// trains across them: six ranks, node ranks in host-name order, local ranks within each host.
// Where the machine does not allow namespaces, the test says so and skips.
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "tests/local_cluster.h"
#include "tests/network_namespaces.h"

namespace dtrain::testing {
namespace {

using ::testing::HasSubstr;

TEST(MultiHost, CoordinatorAndThreeWorkersOnTheirOwnHosts_RanksFollowHosts) {
  if (geteuid() != 0) GTEST_SKIP() << "network namespaces need root; this run is not";
  std::string error;
  auto hosts = BridgedHosts::Make(4, &error);
  if (hosts == nullptr)
    GTEST_SKIP() << "this machine does not allow namespaces and a bridge: " << error;
  LocalCluster cluster(absl::StrCat(::testing::TempDir(), "/multi-host-", getpid()));
  const std::string coordinator = hosts->address(0) + ":29610";
  ASSERT_TRUE(cluster.StartCoordinator(coordinator, {"--insecure"}, hosts->launcher(0, "coord")));
  // Worker w<i> on host "node-<2-i>": host names sort the other way from worker names, so node
  // ranks visibly follow the hosts.
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(cluster.AddWorker(absl::StrCat("w", i),
                                  {"--coordinator=" + coordinator,
                                   "--listen=" + hosts->address(i + 1) + ":29611", "--insecure"},
                                  hosts->launcher(i + 1, absl::StrCat("node-", 2 - i))));
  }
  ASSERT_TRUE(WaitFor([&] { return cluster.AliveWorkers() == 3; }, absl::Seconds(20)));
  const std::string id = cluster.Submit("hosts", R"(name: hosts
model: {builtin: mlp}
data:
  synthetic: {train_size: 1536, val_size: 96, test_size: 96, seed: 3}
  batch_size: 32
trainer: {max_epochs: 1, strategy: ddp_spawn, devices: 2, num_nodes: 3}
seed_everything: 1
optimizer: {name: sgd, lr: 0.05}
)");
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(WaitFor([&] { return IsTerminal(cluster.GetJob(id).state()); }, absl::Seconds(180)));
  const v1::JobStatus done = cluster.GetJob(id);
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.reason();
  // 1536 samples over 6 ranks in batches of 32: 8 steps.
  EXPECT_EQ(done.progress().global_step(), 8);
  const std::string log = cluster.Dtrain("logs " + id).output;
  EXPECT_THAT(
      log, HasSubstr("ranks: rank 0 on 'w2' (node 0, local 0), rank 1 on 'w2' (node 0, local 1), "
                     "rank 2 on 'w1' (node 1, local 0), rank 3 on 'w1' (node 1, local 1), "
                     "rank 4 on 'w0' (node 2, local 0), rank 5 on 'w0' (node 2, local 1)"));
  CommandResult workers = cluster.Dtrain("workers");
  EXPECT_THAT(workers.output, HasSubstr(hosts->address(1) + ":29611"));
}

}  // namespace
}  // namespace dtrain::testing
