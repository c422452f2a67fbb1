// The coordinator SIGKILLed mid-job and restarted on the same state directory and port: its
// jobs are all listed again from its SQLite database (finished ones with their metrics), the
// workers reconnect by themselves, and the job that was running resumes from its last
// checkpoint and ends at exactly the step a run without the crash ends at. When that checkpoint
// is gone, the job ends FAILED saying so.
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "client/channel.h"
#include "common/job_spec.h"
#include "dtrain/v1/coordinator.grpc.pb.h"
#include "dtrain/v1/jobs.grpc.pb.h"
#include "tests/test_support.h"
#include "tests/worker_process.h"

namespace dtrain::testing {
namespace {

using ::testing::HasSubstr;

// 4096 samples over 2 ranks in batches of 32: 64 optimizer steps per epoch.
constexpr int kEpochs = 4;
constexpr int64_t kStepsPerEpoch = 64;

class CoordinatorRestartTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "/restart-", getpid(), "-",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    StartCoordinator("127.0.0.1:0");
    ASSERT_GT(port_, 0);
    address_ = absl::StrCat("127.0.0.1:", port_);
    for (int i = 0; i < 2; ++i) {
      workers_.push_back(WorkerProcess::Start(address_, {absl::StrCat("--name=w", i), "--threads=1"}));
      ASSERT_NE(workers_.back(), nullptr);
    }
    jobs_ = v1::Jobs::NewStub(ConnectToCoordinator(address_));
    coordinator_stub_ = v1::Coordinator::NewStub(ConnectToCoordinator(address_));
    ASSERT_TRUE(WaitFor([&] { return AliveWorkers() == 2; }, absl::Seconds(10)));
  }

  void TearDown() override {
    workers_.clear();
    if (coordinator_ != nullptr) {
      coordinator_->Kill(SIGTERM);
      EXPECT_NE(coordinator_->Wait(absl::Seconds(15)), -1) << "the coordinator did not stop";
    }
  }

  void StartCoordinator(const std::string& listen) {
    const std::string port_file = dir_ + "/coordinator.port";
    std::filesystem::remove(port_file);
    coordinator_ = Subprocess::Start({DTRAIN_COORDINATOR_BIN, "--listen=" + listen,
                                      "--port_file=" + port_file, "--state-dir=" + dir_ + "/state",
                                      "--heartbeat-timeout=5s"});
    ASSERT_NE(coordinator_, nullptr);
    port_ = WaitForPortFile(port_file, absl::Seconds(20));
  }

  void KillAndRestartCoordinator() {
    coordinator_->Kill(SIGKILL);
    ASSERT_NE(coordinator_->Wait(absl::Seconds(10)), -1);
    StartCoordinator(address_);
    ASSERT_GT(port_, 0) << "the restarted coordinator could not take its port back";
  }

  int AliveWorkers() {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    v1::ListWorkersResponse response;
    if (!coordinator_stub_->ListWorkers(&context, {}, &response).ok()) return -1;
    int alive = 0;
    for (const v1::WorkerInfo& w : response.workers()) alive += w.state() == v1::WorkerInfo::ALIVE;
    return alive;
  }

  // The job's status; a default one while the coordinator is not answering.
  v1::JobStatus GetJob(const std::string& id) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    v1::GetJobRequest request;
    request.set_id(id);
    v1::JobStatus status;
    if (!jobs_->GetJob(&context, request, &status).ok()) return v1::JobStatus();
    return status;
  }

  std::string Submit(const std::string& name, int epochs) {
    const std::string path = absl::StrCat(dir_, "/", name, ".yaml");
    std::ofstream(path) << "name: " << name << R"(
model: {builtin: mlp}
data:
  synthetic: {train_size: 4096, val_size: 256, test_size: 256, seed: 3}
  batch_size: 32
trainer: {max_epochs: )" << epochs << R"(, strategy: ddp, num_workers: 2, seed: 1}
optimizer: {name: sgd, lr: 0.05}
checkpoint: {save_top_k: 1}
)";
    CommandResult submitted = Dtrain("submit " + path);
    EXPECT_EQ(submitted.exit_code, 0) << submitted.output;
    return absl::StrCat(name, "-1");
  }

  CommandResult Dtrain(const std::string& args) {
    return RunShell(absl::StrCat("DTRAIN_COORDINATOR=", address_, " " DTRAIN_CLI_BIN " ", args));
  }

  // Waits until `id` has written a checkpoint and is still running; returns that checkpoint.
  std::string WaitForFirstCheckpoint(const std::string& id) {
    std::string checkpoint;
    EXPECT_TRUE(WaitFor([&] {
      v1::JobStatus s = GetJob(id);
      checkpoint = s.checkpoint();
      return !checkpoint.empty() || IsTerminal(s.state());
    }, absl::Seconds(120)));
    EXPECT_EQ(GetJob(id).state(), v1::RUNNING) << "the job ended before the crash could hit it";
    return checkpoint;
  }

  std::string dir_, address_;
  int port_ = 0;
  std::unique_ptr<Subprocess> coordinator_;
  std::vector<std::unique_ptr<WorkerProcess>> workers_;
  std::unique_ptr<v1::Jobs::Stub> jobs_;
  std::unique_ptr<v1::Coordinator::Stub> coordinator_stub_;
};

TEST_F(CoordinatorRestartTest, SigkillMidJob_JobsListedAgain_RunningJobResumesFromCheckpoint) {
  const std::string done = Submit("before", 1);
  ASSERT_TRUE(WaitFor([&] { return GetJob(done).state() == v1::SUCCEEDED; }, absl::Seconds(120)));
  const v1::JobStatus done_before = GetJob(done);
  const std::string id = Submit("long", kEpochs);
  const std::string checkpoint = WaitForFirstCheckpoint(id);
  ASSERT_FALSE(checkpoint.empty());
  const int64_t step_at_crash = GetJob(id).progress().global_step();
  KillAndRestartCoordinator();

  // Everything is listed again at once, the finished job with its outcome and metrics.
  CommandResult list = Dtrain("list");
  EXPECT_EQ(list.exit_code, 0) << list.output;
  EXPECT_THAT(list.output, HasSubstr(done));
  EXPECT_THAT(list.output, HasSubstr(id));
  // (This process's channel reconnects on its own schedule.)
  ASSERT_TRUE(WaitFor([&] { return !GetJob(done).id().empty(); }, absl::Seconds(10)));
  const v1::JobStatus done_after = GetJob(done);
  EXPECT_EQ(done_after.state(), v1::SUCCEEDED);
  EXPECT_EQ(done_after.progress().global_step(), kStepsPerEpoch);
  EXPECT_EQ(done_after.metrics().at("test_acc"), done_before.metrics().at("test_acc"));
  CommandResult results = Dtrain("results " + done);
  EXPECT_EQ(results.exit_code, 0) << results.output;
  EXPECT_THAT(results.output, HasSubstr("train_loss"));

  // The workers come back by themselves and the job resumes and finishes.
  ASSERT_TRUE(WaitFor([&] { return IsTerminal(GetJob(id).state()); }, absl::Seconds(180)));
  const v1::JobStatus resumed = GetJob(id);
  ASSERT_EQ(resumed.state(), v1::SUCCEEDED) << resumed.reason();
  // Exactly the steps of an uninterrupted run: none lost, none applied twice.
  EXPECT_EQ(resumed.progress().global_step(), kEpochs * kStepsPerEpoch);
  EXPECT_GT(resumed.metrics().at("test_acc"), 0.5);
  CommandResult logs = Dtrain("logs " + id);
  EXPECT_THAT(logs.output, HasSubstr("the coordinator restarted while this job ran; it resumes "
                                     "from its last checkpoint " + checkpoint));
  EXPECT_THAT(logs.output, HasSubstr("resumed from "));
  // Lines from before the crash are still there.
  EXPECT_THAT(logs.output, HasSubstr("group formed"));
  std::printf("crashed at step %ld after checkpoint %s; resumed and ended at step %ld\n",
              static_cast<long>(step_at_crash), checkpoint.c_str(),
              static_cast<long>(resumed.progress().global_step()));
}

TEST_F(CoordinatorRestartTest, CheckpointGoneAfterRestart_JobFailsSayingSo) {
  const std::string id = Submit("lost", kEpochs);
  const std::string checkpoint = WaitForFirstCheckpoint(id);
  ASSERT_FALSE(checkpoint.empty());
  coordinator_->Kill(SIGKILL);
  ASSERT_NE(coordinator_->Wait(absl::Seconds(10)), -1);
  // The workers still run the job's step that fails without the coordinator, and may write no
  // further checkpoint: remove every one there is.
  std::filesystem::remove_all(std::filesystem::path(checkpoint).parent_path());
  StartCoordinator(address_);
  ASSERT_GT(port_, 0);
  ASSERT_TRUE(WaitFor([&] { return IsTerminal(GetJob(id).state()); }, absl::Seconds(120)));
  const v1::JobStatus status = GetJob(id);
  EXPECT_EQ(status.state(), v1::FAILED);
  EXPECT_THAT(status.reason(), HasSubstr(std::filesystem::path(checkpoint).filename().string()));
  std::printf("FAILED: %s\n", status.reason().c_str());
  // The workers are free for the next job.
  ASSERT_TRUE(WaitFor([&] { return AliveWorkers() == 2; }, absl::Seconds(15)));
}

}  // namespace
}  // namespace dtrain::testing
