// Network faults between "hosts" made of network namespaces: the coordinator in this test's
// namespace, each worker in a namespace of its own joined to it by a veth pair (addresses only
// inside those). A partition (the worker's link down mid-epoch) fails the job within the
// heartbeat timeout, naming the worker, and the worker is idle again once the link is back.
// Delay and loss run through tc netem where the kernel has it. Where the machine denies
// namespaces or netem, the test says so and skips.
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "tests/local_cluster.h"
#include "tests/network_namespaces.h"

namespace dtrain::testing {
namespace network_fault_test {

using ::testing::HasSubstr;

class NetworkFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "network namespaces need root; this run is not";
    for (int i = 1; i <= 2; ++i) {
      std::string error;
      hosts_.push_back(NetworkNamespace::Make(i, &error));
      if (hosts_.back() == nullptr) {
        GTEST_SKIP() << "this machine does not allow network namespaces with veth: " << error;
      }
    }
    cluster_ = std::make_unique<LocalCluster>(
        absl::StrCat(::testing::TempDir(), "/netfault-", getpid(), "-",
                     ::testing::UnitTest::GetInstance()->current_test_info()->name()));
    // Every namespace reaches this one's side of its own link, and through it the others'. The
    // coordinator binds port 0 and gives its workers the port it got at that address. Its
    // collective timeout is the default of jobs that set none (AutoPlane below).
    ASSERT_TRUE(cluster_->StartCoordinator(
        "0.0.0.0:0", {"--insecure", absl::StrCat("--advertise=", hosts_[0]->gateway(), ":0"),
                      "--collective_timeout=4s"}));
    coordinator_ = absl::StrCat(hosts_[0]->gateway(), ":",
                                cluster_->address().substr(cluster_->address().rfind(':') + 1));
    for (int i = 0; i < 2; ++i) {
      ASSERT_TRUE(cluster_->AddWorker(absl::StrCat("w", i),
                                      {"--coordinator=" + coordinator_,
                                       "--listen=" + hosts_[i]->address() + ":0", "--insecure"},
                                      hosts_[i]->launcher()));
    }
    ASSERT_TRUE(WaitFor([&] { return cluster_->AliveWorkers() == 2; }, absl::Seconds(15)));
  }

  // On the coordinator's plane: these namespaces reach the coordinator but not each other
  // (this namespace does not forward), so Gloo could never connect; AutoPlane below shows
  // what auto does then. `collective_timeout_ms` 0: the spec sets none.
  std::string SubmitJob(int epochs, const std::string& backend = "grpc",
                        int collective_timeout_ms = 10000) {
    std::string trainer = absl::StrCat(", collective_backend: ", backend);
    if (collective_timeout_ms > 0) {
      absl::StrAppend(&trainer, ", collective_timeout_ms: ", collective_timeout_ms);
    }
    return cluster_->Submit("net", SyntheticDdpJob("net", epochs, 4096, trainer));
  }

  std::vector<std::unique_ptr<NetworkNamespace>> hosts_;
  std::unique_ptr<LocalCluster> cluster_;
  std::string coordinator_;
};

TEST_F(NetworkFaultTest, PartitionedWorker_JobFailsNamingIt_WorkerBackAfterHealing) {
  const std::string id = SubmitJob(20);
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(WaitFor([&] { return cluster_->GetJob(id).progress().global_step() > 0; },
                      absl::Seconds(60)));
  const absl::Time cut = absl::Now();
  ASSERT_TRUE(hosts_[1]->SetLink(false));
  ASSERT_TRUE(WaitFor([&] { return IsTerminal(cluster_->GetJob(id).state()); }, absl::Seconds(30)));
  const double seconds = absl::ToDoubleSeconds(absl::Now() - cut);
  const v1::JobStatus status = cluster_->GetJob(id);
  EXPECT_EQ(status.state(), v1::FAILED);
  EXPECT_THAT(status.reason(), HasSubstr("'w1'"));
  EXPECT_LT(seconds, 15.0) << "heartbeat timeout 5 s + 2 s grace, with room";
  std::printf("partition of w1: job FAILED after %.1f s: %s\n", seconds, status.reason().c_str());
  ASSERT_TRUE(hosts_[1]->SetLink(true));
  EXPECT_TRUE(
      WaitFor([&] { return cluster_->AliveWorkers(/*idle_only=*/true) == 2; }, absl::Seconds(30)))
      << "w1 did not come back idle after the link healed";
}

// Hosts that reach the coordinator but not each other: auto tries Gloo for its connect timeout
// (the collective timeout when shorter than 30 s: here the coordinator's --collective_timeout,
// 4 s, as the spec sets none), then every rank falls back to the coordinator's collectives and
// the job log says why. Group formation takes that budget and little more (it took five
// budgets and 7 s more while Gloo's pairs multiplied it, and 30 s while the workers' planes
// took 10 minutes, not the coordinator's default, for a spec without a collective timeout).
TEST_F(NetworkFaultTest, AutoPlane_PeersCannotReachEachOther_FallsBackToGrpc) {
  const std::string id = SubmitJob(1, "auto", 0);
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(WaitFor([&] { return IsTerminal(cluster_->GetJob(id).state()); }, absl::Seconds(90)));
  const v1::JobStatus status = cluster_->GetJob(id);
  EXPECT_EQ(status.state(), v1::SUCCEEDED) << status.reason();
  const CommandResult logs = cluster_->Dtrain("logs " + id);
  EXPECT_THAT(logs.output, HasSubstr("peer-to-peer collectives are not possible"));
  EXPECT_THAT(logs.output, HasSubstr("falling back to the coordinator's grpc collectives"));
  const double group = status.progress().phase_seconds().at("group");
  EXPECT_GE(group, 3.9) << "Gloo gave up before its 4 s connect budget";
  EXPECT_LT(group, 10.0) << "the fallback took more than the 4 s connect budget and 6 s of slack";
  std::printf("group formed in %.1f s\n%s\n", group, logs.output.c_str());
}

// The same hosts with an explicit gloo: the job fails within the connect budget (plus the wait
// for the coordinator's verdict on the members, 5 s + 2 s), naming the peer it could not reach.
TEST_F(NetworkFaultTest, ExplicitGloo_PeersCannotReachEachOther_FailsNamingThePeer) {
  const absl::Time submitted = absl::Now();
  const std::string id = SubmitJob(1, "gloo", 4000);
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(WaitFor([&] { return IsTerminal(cluster_->GetJob(id).state()); }, absl::Seconds(60)));
  const double seconds = absl::ToDoubleSeconds(absl::Now() - submitted);
  const v1::JobStatus status = cluster_->GetJob(id);
  EXPECT_EQ(status.state(), v1::FAILED);
  EXPECT_THAT(status.reason(), HasSubstr("gloo rendezvous failed on rank"));
  EXPECT_THAT(status.reason(), HasSubstr("Connect timeout"));
  EXPECT_THAT(status.reason(), HasSubstr("could not connect within 4s"));
  EXPECT_THAT(status.reason(),
              ::testing::AnyOf(HasSubstr(hosts_[0]->address()), HasSubstr(hosts_[1]->address())));
  EXPECT_LT(seconds, 18.0) << "4 s to connect and 7 s for the verdict, with room; five connect "
                              "budgets (20 s) while Gloo's pairs multiplied it";
  std::printf("explicit gloo: FAILED after %.1f s: %s\n", seconds, status.reason().c_str());
}

TEST_F(NetworkFaultTest, DelayAndLoss_JobStillSucceeds) {
  CommandResult probe = hosts_[1]->Netem("delay 10ms 2ms loss 1%");
  if (probe.exit_code != 0) {
    GTEST_SKIP() << "tc netem is not available on this machine's kernel: " << probe.output;
  }
  const std::string id = SubmitJob(1);
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(
      WaitFor([&] { return IsTerminal(cluster_->GetJob(id).state()); }, absl::Seconds(240)));
  const v1::JobStatus status = cluster_->GetJob(id);
  EXPECT_EQ(status.state(), v1::SUCCEEDED) << status.reason();
  EXPECT_EQ(status.progress().global_step(), 64);
}

}  // namespace network_fault_test
}  // namespace dtrain::testing
