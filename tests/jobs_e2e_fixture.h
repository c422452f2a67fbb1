// The fixture of the end-to-end job tests (jobs_e2e_test, jobs_command_line_e2e_test,
// jobs_faults_e2e_test, job_files_e2e_test, shards_e2e_test): a real local cluster (a
// dtrain-coordinator and two dtrain-worker processes on 127.0.0.1) driven by the dtrain command
// line as a user would, and a small synthetic ddp job spec.
#pragma once

#include <unistd.h>

#include <memory>
#include <string>

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "dtrain/v1/jobs.pb.h"
#include "tests/local_cluster.h"

namespace dtrain::testing {

class JobsE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster_ = std::make_unique<LocalCluster>(
        absl::StrCat(::testing::TempDir(), "/jobs-e2e-", getpid(), "-",
                     ::testing::UnitTest::GetInstance()->current_test_info()->name()));
    ASSERT_TRUE(cluster_->StartCoordinator());
    ASSERT_TRUE(cluster_->AddWorker("w0"));
    ASSERT_TRUE(cluster_->AddWorker("w1"));
    ASSERT_TRUE(WaitFor([&] { return IdleWorkers() == 2; }, absl::Seconds(10)));
  }

  void TearDown() override {
    EXPECT_TRUE(cluster_->Shutdown()) << "the coordinator did not stop on SIGTERM within 15 s";
  }

  int IdleWorkers() { return cluster_->AliveWorkers(/*idle_only=*/true); }
  CommandResult Dtrain(const std::string& args) { return cluster_->Dtrain(args); }
  std::string WriteJob(const std::string& name, const std::string& text) {
    return cluster_->WriteSpec(name, text);
  }
  const std::string& dir() const { return cluster_->dir(); }

  static google::protobuf::Struct ParseJson(const std::string& text) {
    google::protobuf::Struct out;
    // The JSON object is the output's last top-level {...}.
    const size_t start = text.find("{\n");
    EXPECT_NE(start, std::string::npos) << text;
    EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(text.substr(start), &out).ok()) << text;
    return out;
  }

  // One compact JSON object (a line of --output json's streams or errors).
  static google::protobuf::Struct ParseJsonLine(const std::string& text) {
    google::protobuf::Struct out;
    const std::string line = text.substr(0, text.find('\n'));
    EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(line, &out).ok()) << text;
    return out;
  }

  v1::JobStatus GetJob(const std::string& id) {
    const v1::JobStatus status = cluster_->GetJob(id);
    EXPECT_EQ(status.id(), id) << "the coordinator did not answer GetJob";
    return status;
  }

  std::unique_ptr<LocalCluster> cluster_;
};

// A 2-worker ddp MLP on synthetic data: train_size / 64 optimizer steps per epoch, validation
// twice an epoch, the best checkpoint by val_acc kept.
inline std::string SyntheticJob(const std::string& name, int epochs, int train_size = 2048) {
  return absl::StrCat(R"(name: )", name, R"(
model: {builtin: mlp}
data:
  synthetic: {train_size: )",
                      train_size, R"(, val_size: 256, test_size: 512, seed: 3}
  batch_size: 32
trainer:
  max_epochs: )",
                      epochs, R"(
  strategy: ddp
  num_nodes: 2
  val_check_interval: 0.5
seed_everything: 1
optimizer: {name: sgd, lr: 0.05, momentum: 0.9}
lr_scheduler: {name: cosine}
checkpoint: {monitor: val_acc, save_top_k: 1}
)");
}

}  // namespace dtrain::testing
