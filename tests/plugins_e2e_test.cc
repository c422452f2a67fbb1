// Plugins by registration, from the outside: dtrain-worker --plugin loads the example library
// (examples/plugins), its workers report what it offers, the coordinator refuses a job naming a
// plugin nobody offers (listing what is offered) and places a job naming plugins only on workers
// that have them; the plugin strategy is called at Lightning's moments, the plugin checkpoint
// IO writes the job's checkpoints with its storage_options, and a plugin accelerator's hook
// that reads .grad between steps sees the averaged gradients.
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tests/jobs_e2e_fixture.h"
#include "tests/test_support.h"

namespace dtrain::testing {
namespace plugins_e2e_test {

using ::testing::HasSubstr;

class PluginsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster_ = std::make_unique<LocalCluster>(
        absl::StrCat(::testing::TempDir(), "/plugins-", getpid(), "-",
                     ::testing::UnitTest::GetInstance()->current_test_info()->name()));
    records_ = cluster_->dir() + "/records";
    std::filesystem::create_directories(records_);
    // The workers inherit it: recording_ddp writes its record there.
    setenv("RECORDING_DDP_DIR", records_.c_str(), 1);
    ASSERT_TRUE(cluster_->StartCoordinator());
    // "a-plain" sorts first, so placement by name alone would take it.
    ASSERT_TRUE(cluster_->AddWorker("a-plain"));
    ASSERT_TRUE(cluster_->AddWorker("w0", {"--plugin=" DTRAIN_EXAMPLE_PLUGINS}));
    ASSERT_TRUE(cluster_->AddWorker("w1", {"--plugin=" DTRAIN_EXAMPLE_PLUGINS}));
    ASSERT_TRUE(WaitFor([&] { return cluster_->AliveWorkers(true) == 3; }, absl::Seconds(10)));
  }
  void TearDown() override { EXPECT_TRUE(cluster_->Shutdown()); }

  std::vector<std::string> Record(int rank) {
    std::ifstream in(absl::StrCat(records_, "/rank-", rank, ".log"));
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
  }

  std::unique_ptr<LocalCluster> cluster_;
  std::string records_;
};

std::string PluginJob(const std::string& name, const std::string& strategy) {
  return absl::StrCat("name: ", name, R"(
model: {builtin: mlp}
data:
  synthetic: {train_size: 512, val_size: 128, test_size: 128, seed: 3}
  batch_size: 32
trainer: {max_epochs: 1, strategy: )",
                      strategy, R"(, num_nodes: 2}
seed_everything: 1
optimizer: {name: sgd, lr: 0.05}
checkpoint: {checkpoint_io: checksum, storage_options: {fsync: "true"}}
)");
}

TEST_F(PluginsTest, PluginStrategyAndCheckpointIO_RunOnTheWorkersOfferingThem) {
  const std::string id = cluster_->Submit("recorded", PluginJob("recorded", "recording_ddp"));
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(
      WaitFor([&] { return IsTerminal(cluster_->GetJob(id).state()); }, absl::Seconds(120)));
  const v1::JobStatus job = cluster_->GetJob(id);
  ASSERT_EQ(job.state(), v1::SUCCEEDED) << job.reason();
  EXPECT_THAT(std::vector<std::string>(job.workers().begin(), job.workers().end()),
              ::testing::ElementsAre("w0", "w1"));
  EXPECT_GT(job.metrics().at("test_acc"), 0.3);

  // The teardown hook's record is written as each rank is torn down, before a success is
  // published; waited for all the same, so that a regression shows as a timeout.
  ASSERT_TRUE(WaitFor(
      [&] {
        return absl::c_linear_search(Record(0), "teardown") &&
               absl::c_linear_search(Record(1), "teardown");
      },
      absl::Seconds(30)))
      << "no teardown record:\n"
      << absl::StrJoin(Record(0), "\n");
  // Both ranks' records: Lightning's moments, in Lightning's order. 512 / (32 x 2) = 8 batches.
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE(absl::StrCat("rank ", rank));
    const std::vector<std::string> lines = Record(rank);
    std::vector<std::string> kinds;
    int batches = 0, steps = 0;
    for (const std::string& line : lines) {
      if (absl::StartsWith(line, "on_train_batch_start")) {
        ++batches;
      } else if (line == "post_optimizer_step") {
        ++steps;
      } else {
        kinds.push_back(line);
      }
    }
    EXPECT_EQ(batches, 8);
    EXPECT_EQ(steps, 8);
    // The sanity check's validation comes before on_train_start, as in Lightning.
    EXPECT_THAT(kinds,
                ::testing::ElementsAre("pre_dispatch", "dispatch", "on_validation_start",
                                       "on_validation_end", "on_train_start", "on_validation_start",
                                       "on_validation_end", "on_train_end", "on_test_start",
                                       "on_test_end", "post_dispatch", "teardown"))
        << absl::StrJoin(lines, "\n");
    ASSERT_GE(lines.size(), 6u);
    EXPECT_EQ(lines[5], "on_train_batch_start 0");
  }

  // The checkpoint IO wrote a checksum beside each checkpoint rank 0 wrote (its sidecars go with
  // the worker's scratch at teardown; it records each digest): every checkpoint the coordinator
  // stored has one of them, so its bytes are those the checkpoint IO wrote.
  std::set<std::string> digests;
  {
    std::ifstream in(absl::StrCat(records_, "/checksum.log"));
    for (std::string line; std::getline(in, line);) digests.insert(line);
  }
  ASSERT_FALSE(digests.empty());
  for (const std::string& digest : digests) {
    EXPECT_EQ(digest.rfind("sha256:", 0), 0u) << digest;
    EXPECT_EQ(digest.size(), 7u + 64u);
  }
  int stored = 0;
  for (const v1::JobFile& file : job.files()) {
    if (file.kind() != "checkpoint") continue;
    EXPECT_EQ(digests.count(file.digest()), 1u) << file.name() << " " << file.digest();
    ++stored;
  }
  EXPECT_GE(stored, 1);
}

// A plugin accelerator whose hook reads .grad between a call's steps (gradient_watch) sees the
// averaged gradients there, the same on both ranks to the bit: ddp's split step, which leaves a
// step's mean only in each rank's own part when nothing reads it before the next backward,
// writes it everywhere when a plugin's hooks run in between.
TEST_F(PluginsTest, PluginAcceleratorReadingGradients_SeesTheAveragedOnesBetweenSteps) {
  const std::string id = cluster_->Submit("watched", R"(name: watched
model: {builtin: mlp}
data:
  synthetic: {train_size: 1024, val_size: 64, test_size: 64, seed: 3}
  batch_size: 32
trainer: {max_epochs: 1, strategy: ddp, num_nodes: 2, accelerator: gradient_watch,
          batches_per_call: 4, collective_backend: shm}
seed_everything: 1
optimizer: {name: sgd, lr: 0.05, momentum: 0.9}
)");
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(
      WaitFor([&] { return IsTerminal(cluster_->GetJob(id).state()); }, absl::Seconds(120)));
  const v1::JobStatus job = cluster_->GetJob(id);
  ASSERT_EQ(job.state(), v1::SUCCEEDED) << job.reason();
  CommandResult logs = cluster_->Dtrain("logs " + id);
  EXPECT_THAT(logs.output, HasSubstr("its step split between the 2 ranks, the mean on every rank "
                                     "at every step"))
      << logs.output;
  // "<batch_idx> <nonzero elements> <digest>" per batch; 1024 / (32 x 2) = 16 batches a rank.
  std::vector<std::vector<std::string>> seen(2);
  for (int rank = 0; rank < 2; ++rank) {
    std::ifstream in(absl::StrCat(records_, "/gradients-rank-", rank, ".log"));
    for (std::string line; std::getline(in, line);) seen[rank].push_back(line);
    ASSERT_EQ(seen[rank].size(), 16u) << absl::StrJoin(seen[rank], "\n");
  }
  for (size_t i = 0; i < 16; ++i) {
    SCOPED_TRACE(seen[0][i]);
    const std::vector<std::string> fields = absl::StrSplit(seen[0][i], ' ');
    ASSERT_EQ(fields.size(), 3u);
    EXPECT_EQ(fields[0], std::to_string(i));
    // Batch 0's gradients are the buckets' fresh zeros; every later batch sees a step's.
    EXPECT_EQ(std::stoll(fields[1]) > 0, i > 0);
    EXPECT_EQ(fields[2].rfind("sha256:", 0), 0u);
    EXPECT_EQ(seen[0][i], seen[1][i]) << "the ranks saw different gradients between two steps";
  }
}

TEST_F(PluginsTest, UnknownPlugin_RefusedAtSubmit_ListingWhatTheWorkersOffer) {
  CommandResult refused = cluster_->Dtrain(
      absl::StrCat("fit --config ", cluster_->WriteSpec("nope", PluginJob("nope", "horovod"))));
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_THAT(refused.output, HasSubstr("trainer.strategy: unknown strategy 'horovod'"));
  EXPECT_THAT(refused.output, HasSubstr("a plugin a worker offers: recording_ddp (w0, w1)"));

  // The workers' plugins are in their listing too.
  CommandResult workers = cluster_->Dtrain("workers --output json");
  EXPECT_THAT(workers.output, HasSubstr("recording_ddp"));
  EXPECT_THAT(workers.output, HasSubstr("checksum"));
}

TEST(PluginLoading, ABadLibrary_StopsTheWorkerSayingWhy) {
  CommandResult missing = RunShell(
      absl::StrCat(DTRAIN_WORKER_BIN, " --plugin=/nonexistent/lib.so --listen=127.0.0.1:0 2>&1"));
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_THAT(missing.output, HasSubstr("--plugin=/nonexistent/lib.so: cannot load"));
  // A shared library that is no dtrain plugin (libz has no entry point).
  CommandResult foreign =
      RunShell(absl::StrCat(DTRAIN_WORKER_BIN, " --plugin=libz.so.1 --listen=127.0.0.1:0 2>&1"));
  EXPECT_EQ(foreign.exit_code, 2);
  EXPECT_THAT(foreign.output, HasSubstr("no dtrain plugin entry point"));
  // A library built for another interface version: refused before its entry point runs (which
  // would trap), naming both versions.
  CommandResult stale = RunShell(absl::StrCat(
      DTRAIN_WORKER_BIN, " --plugin=", DTRAIN_OTHER_ABI_PLUGIN, " --listen=127.0.0.1:0 2>&1"));
  EXPECT_EQ(stale.exit_code, 2) << stale.output;
  EXPECT_THAT(stale.output,
              HasSubstr("built for plugin interface version 1, this worker has version "));
  EXPECT_THAT(stale.output, HasSubstr("; rebuild it"));
}

}  // namespace plugins_e2e_test
}  // namespace dtrain::testing
