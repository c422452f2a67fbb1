// Four "hosts" on one machine: the coordinator and three workers, each in a network namespace
// and a UTS namespace of its own (its own address and host name), joined by a bridge; their
// addresses exist only inside those namespaces. A ddp_spawn job with two devices per worker
// trains across them: six ranks, node ranks in host-name order, local ranks within each host.
// A second test gives each worker a mount namespace too, where the client's directory and the
// coordinator's state directory do not exist: everything a job needs travels through the
// coordinator. Where the machine does not allow namespaces, the tests say so and skip.
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/job_spec.h"
#include "tests/checkpoint_comparison.h"
#include "tests/local_cluster.h"
#include "tests/network_namespaces.h"

namespace dtrain::testing {
namespace multi_host_test {

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
  ASSERT_TRUE(WaitFor([&] { return cluster.AliveWorkers() == 3; }, absl::Seconds(60)));
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

// No shared filesystem: a model and a dataset that exist only in the client's directory train
// with ddp on two workers that cannot see that directory nor the coordinator's state directory.
// Rank 0's checkpoints go to the coordinator; the coordinator is SIGKILLed mid-training and
// restarted; the job resumes from its last checkpoint (which the workers fetch), ends in exactly
// the state of the same job run without the crash (step, weights and momentum, bit for bit,
// over Gloo), and `dtrain download` brings the best checkpoint back to the client, where
// Python's torch loads it.
TEST(MultiHost, NoSharedFilesystem_FilesTravel_CoordinatorKilled_ResumesAndTheBestComesHome) {
  if (geteuid() != 0) GTEST_SKIP() << "network and mount namespaces need root; this run is not";
  std::string error;
  auto hosts = BridgedHosts::Make(3, &error);
  if (hosts == nullptr)
    GTEST_SKIP() << "this machine does not allow namespaces and a bridge: " << error;
  const std::string dir = absl::StrCat(::testing::TempDir(), "/no-shared-fs-", getpid());
  LocalCluster cluster(dir);
  const std::string client = dir + "/client";
  std::filesystem::create_directories(client);
  // The user's files: a TorchScript model exported by Python and a tensors file.
  std::ofstream(client + "/make.py") << R"(
import torch, torch.nn as nn, torch.nn.functional as F
from typing import Tuple
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 32)
        self.fc2 = nn.Linear(32, 4)
    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))
    @torch.jit.export
    def training_step(self, batch: Tuple[torch.Tensor, torch.Tensor], batch_idx: int):
        x, y = batch
        return F.cross_entropy(self(x), y)
    @torch.jit.export
    def validation_step(self, batch: Tuple[torch.Tensor, torch.Tensor], batch_idx: int):
        x, y = batch
        logits = self(x)
        return {"loss": F.cross_entropy(logits, y), "acc": (logits.argmax(1) == y).float().mean()}
    @torch.jit.export
    def test_step(self, batch: Tuple[torch.Tensor, torch.Tensor], batch_idx: int):
        return self.validation_step(batch, batch_idx)
torch.manual_seed(0)
torch.jit.script(Net()).save("model.pt")
g = torch.Generator().manual_seed(1)
x = torch.randn(4608, 64, generator=g)
y = x[:, :4].argmax(1)
torch.save({"train": (x[:4096], y[:4096]), "val": (x[4096:4352], y[4096:4352]),
            "test": (x[4352:], y[4352:])}, "data.pt")
)";
  CommandResult made = RunShell(absl::StrCat("cd ", client, " && /usr/bin/python3 make.py"));
  ASSERT_EQ(made.exit_code, 0) << made.output;
  const std::string coordinator = hosts->address(0) + ":29610";
  const std::vector<std::string> coordinator_flags = {"--insecure"};
  ASSERT_TRUE(
      cluster.StartCoordinator(coordinator, coordinator_flags, hosts->launcher(0, "coord")));
  for (int i = 1; i <= 2; ++i) {
    ASSERT_TRUE(cluster.AddWorker(
        absl::StrCat("w", i),
        {"--coordinator=" + coordinator, "--listen=" + hosts->address(i) + ":29611", "--insecure"},
        hosts->launcher(i, absl::StrCat("node-", i), {dir})));
  }
  ASSERT_TRUE(WaitFor([&] { return cluster.AliveWorkers() == 2; }, absl::Seconds(20)));
  // The proof that nothing is shared: on a worker's host the client's model is not there.
  std::vector<std::string> probe = hosts->launcher(1, "node-1", {dir});
  probe.insert(probe.end(), {"test", "-e", client + "/model.pt"});
  for (std::string& arg : probe) arg = "'" + arg + "'";
  EXPECT_NE(RunShell(absl::StrJoin(probe, " ")).exit_code, 0) << "the worker's host sees the file";

  // 4096 samples over 2 ranks in batches of 32: 64 steps per epoch, 768 in all.
  auto spec = [](const std::string& name) {
    return absl::StrCat("name: ", name, R"(
model: {torchscript: client/model.pt}
data: {tensors_file: client/data.pt, batch_size: 32}
trainer: {max_epochs: 12, strategy: ddp, num_nodes: 2}
seed_everything: 1
optimizer: {name: sgd, lr: 0.05, momentum: 0.9}
checkpoint: {monitor: val_acc, save_top_k: 1, every_n_steps: 16}
)");
  };
  // The same job without the crash, to its end: what the crashed one must end as.
  const std::string reference = RunToTheEnd(cluster, "reference", spec("reference"));
  ASSERT_FALSE(reference.empty());
  const std::string id = cluster.Submit("travel", spec("travel"));
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(WaitFor(
      [&] {
        const v1::JobStatus s = cluster.GetJob(id);
        return (!s.checkpoint().empty() && s.progress().global_step() >= 40) ||
               IsTerminal(s.state());
      },
      absl::Seconds(120)));
  const v1::JobStatus before = cluster.GetJob(id);
  ASSERT_EQ(before.state(), v1::RUNNING) << "the job ended before the crash: " << before.reason();
  EXPECT_EQ(before.spec().model().torchscript().rfind("artifact:sha256:", 0), 0u);
  cluster.StopCoordinator(SIGKILL);
  ASSERT_TRUE(
      cluster.StartCoordinator(coordinator, coordinator_flags, hosts->launcher(0, "coord")));
  ASSERT_TRUE(WaitFor([&] { return IsTerminal(cluster.GetJob(id).state()); }, absl::Seconds(240)));
  const v1::JobStatus done = cluster.GetJob(id);
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.reason();
  EXPECT_EQ(done.progress().global_step(), 768);
  const std::string log = cluster.Dtrain("logs " + id).output;
  EXPECT_THAT(log, HasSubstr("the coordinator restarted while this job ran; it resumes from its "
                             "last checkpoint job:" +
                             id + "/"));
  EXPECT_THAT(log, HasSubstr("resumed from job:" + id + "/"));
  EXPECT_GT(done.metrics().at("test_acc"), 0.8);
  // The peer-to-peer plane across hosts (gloo) resumes as exactly as shared memory does.
  EXPECT_THAT(log, HasSubstr("collective plane: gloo"));
  EXPECT_TRUE(SameFinalState(cluster, id, reference));

  const std::string home = dir + "/home";
  CommandResult download = cluster.Dtrain("download " + id + " best -o " + home);
  ASSERT_EQ(download.exit_code, 0) << download.output;
  const std::string best = done.best_checkpoint().substr(done.best_checkpoint().rfind('/') + 1);
  CommandResult python = RunShell(
      absl::StrCat("/usr/bin/python3 -c 'import torch; c = torch.load(\"", home, "/", best,
                   "\"); print(\"loaded\", sorted(c[\"state_dict\"]), c[\"global_step\"])'"));
  ASSERT_EQ(python.exit_code, 0) << python.output;
  EXPECT_THAT(python.output,
              HasSubstr("loaded ['fc1.bias', 'fc1.weight', 'fc2.bias', 'fc2.weight']"));
}

}  // namespace multi_host_test
}  // namespace dtrain::testing
