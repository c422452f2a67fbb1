// Jobs end to end against a real local cluster: a dtrain-coordinator and two dtrain-worker
// processes on 127.0.0.1, driven by the dtrain command line as a user would (submit, watch,
// results, logs, list, cancel), on small synthetic data: what a job gives back, the collective
// plane it picks, the cores its ranks run on, early stopping and resuming, testing the best
// checkpoint, gradient accumulation and batches per call. The command line's contract:
// jobs_command_line_e2e_test.cc; jobs that fail: jobs_faults_e2e_test.cc.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <google/protobuf/struct.pb.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "dtrain/v1/jobs.pb.h"
#include "dtrain/v1/worker.pb.h"
#include "dtrain/v1/workers.pb.h"
#include "tests/jobs_e2e_fixture.h"
#include "tests/local_cluster.h"
#include "worker/runtime/cpu_affinity.h"

namespace dtrain::testing {
namespace jobs_e2e_test {

using ::testing::HasSubstr;

TEST_F(JobsE2eTest, SubmitWatchResults_DdpJobOnTwoWorkers) {
  const std::string job = WriteJob("synth", SyntheticJob("synth", 2));
  CommandResult submitted = Dtrain(absl::StrCat("fit --wait --config ", job));
  ASSERT_EQ(submitted.exit_code, 0) << submitted.output;
  EXPECT_THAT(submitted.output, HasSubstr("submitted synth-1\n"));
  const std::string id = "synth-1";
  // Not a terminal: plain progress lines, then the outcome and the final metrics.
  // (A watcher gets the newest status when it is ready for one, so which phases show varies.)
  EXPECT_THAT(submitted.output, HasSubstr("synth-1 RUNNING "));
  EXPECT_THAT(submitted.output,
              HasSubstr(" epoch 2/2 [########################] step 64/64 loss "));
  EXPECT_THAT(submitted.output, HasSubstr("synth-1 SUCCEEDED"));
  EXPECT_THAT(submitted.output, HasSubstr("test_acc"));
  // Watching a job that ended shows its end at once.
  CommandResult watched = Dtrain("watch " + id);
  EXPECT_EQ(watched.exit_code, 0) << watched.output;
  EXPECT_THAT(watched.output, HasSubstr("synth-1 SUCCEEDED"));

  const std::string plot = dir() + "/curves.svg";
  CommandResult results = Dtrain(absl::StrCat("results ", id, " --output json --plot ", plot));
  ASSERT_EQ(results.exit_code, 0) << results.output;
  const google::protobuf::Struct json = ParseJson(results.output);
  EXPECT_EQ(json.fields().at("state").string_value(), "SUCCEEDED");
  const auto& metrics = json.fields().at("metrics").struct_value().fields();
  for (const char* key : {"test_acc", "test_loss", "val_acc", "train_loss"}) {
    ASSERT_TRUE(metrics.count(key)) << key << " missing in " << results.output;
  }
  EXPECT_GT(metrics.at("test_acc").number_value(), 0.9);
  EXPECT_LT(metrics.at("test_loss").number_value(), 0.5);
  EXPECT_EQ(json.fields().at("checkpoint").string_value(), "job:" + id + "/last.ckpt");
  bool listed = false;
  for (const auto& file : json.fields().at("files").list_value().values()) {
    const auto& f = file.struct_value().fields();
    if (f.at("name").string_value() != "last.ckpt") continue;
    listed = true;
    // The mlp's 200k parameters; int64 is a string in proto3's JSON.
    EXPECT_GT(std::stoll(f.at("size_bytes").string_value()), 100000) << results.output;
  }
  EXPECT_TRUE(listed) << results.output;

  // Logs and pictures.
  std::ifstream svg(plot);
  std::string svg_text((std::istreambuf_iterator<char>(svg)), std::istreambuf_iterator<char>());
  EXPECT_THAT(svg_text, HasSubstr("train_loss"));
  EXPECT_THAT(svg_text, HasSubstr("val_acc"));
  const std::string log_dir = json.fields().at("log_dir").string_value();
  // Lightning's CSVLogger shape: a column per metric, sorted, a row per logged step.
  std::ifstream csv(log_dir + "/metrics.csv");
  std::string header;
  std::getline(csv, header);
  // lr-SGD: the workers' learning rate, as Lightning's LearningRateMonitor names it.
  EXPECT_EQ(header, "epoch,lr-SGD,step,test_acc,test_loss,train_loss,val_acc,val_loss");
  int rows = 0, val_rows = 0;
  std::vector<double> lrs;
  for (std::string line; std::getline(csv, line); ++rows) {
    const std::vector<std::string> cells = absl::StrSplit(line, ',');
    ASSERT_EQ(cells.size(), 8u) << line;
    if (!cells[6].empty()) ++val_rows;
    if (!cells[1].empty()) lrs.push_back(std::stod(cells[1]));
  }
  EXPECT_GE(rows, 4);
  EXPECT_EQ(val_rows, 4) << "val_check_interval 0.5 over 2 epochs";
  // Logged with train_loss, the cosine schedule's lr falls from at most the spec's 0.05.
  ASSERT_GE(lrs.size(), 2u);
  EXPECT_LE(lrs.front(), 0.05);
  EXPECT_LT(lrs.back(), lrs.front());
  // The resolved spec beside it, defaults included.
  const std::string hparams = ReadFile(log_dir + "/hparams.yaml");
  EXPECT_THAT(hparams, HasSubstr("name: \"synth\""));
  EXPECT_THAT(hparams, HasSubstr("eval_batch_size: 128"));
  bool events = false;
  for (const auto& entry : std::filesystem::directory_iterator(log_dir)) {
    if (absl::StartsWith(entry.path().filename().string(), "events.out.tfevents.")) {
      events = entry.file_size() > 100;
    }
  }
  EXPECT_TRUE(events) << "no TensorBoard event file in " << log_dir;
  CommandResult logs = Dtrain("logs " + id);
  EXPECT_THAT(logs.output, HasSubstr("group formed: worker 'w0' (rank 0), worker 'w1' (rank 1)"));
  EXPECT_THAT(logs.output, HasSubstr("job SUCCEEDED"));
  // The default plane: both ranks on this host, so shared memory; said in the log and status.
  EXPECT_THAT(logs.output, HasSubstr("collective plane: shm (collective_backend auto)"));
  EXPECT_THAT(logs.output, HasSubstr("first training step starts "));
  EXPECT_THAT(logs.output, HasSubstr("time by phase: placement "));
  // Each rank's mean batch by phase, from the real workers: every phase took time, and the
  // phases fit in the batch (each printed to 3 decimals, so within 5 x 0.0005 ms of it).
  const size_t at = logs.output.find("time per batch by rank: ");
  ASSERT_NE(at, std::string::npos);
  const std::string line = logs.output.substr(at, logs.output.find('\n', at) - at);
  const std::regex profile(
      "rank ([01]) ([0-9.]+) ms: data ([0-9.]+), forward ([0-9.]+), backward ([0-9.]+), "
      "averaging gradients ([0-9.]+), optimizer ([0-9.]+), other [0-9.]+");
  int profiled = 0;
  for (std::sregex_iterator m(line.begin(), line.end(), profile), end; m != end; ++m) {
    ++profiled;
    double phases = 0;
    for (int k = 3; k <= 7; ++k) {
      EXPECT_GT(std::stod((*m)[k]), 0) << "phase " << k - 2 << " of " << (*m)[0];
      phases += std::stod((*m)[k]);
    }
    EXPECT_LE(phases, std::stod((*m)[2]) + 0.0025) << (*m)[0];
  }
  EXPECT_EQ(profiled, 2) << line;
  // And each rank's wait for its core, which these workers' kernel keeps.
  const size_t by_rank = logs.output.find("time by rank: ");
  ASSERT_NE(by_rank, std::string::npos);
  const std::string ranks = logs.output.substr(by_rank, logs.output.find('\n', by_rank) - by_rank);
  const std::regex core_wait(
      "rank [01] ([0-9.]+) s in steps[^;]*, ([0-9.]+) s \\([0-9.]+%\\) for its core");
  int waits = 0;
  for (std::sregex_iterator m(ranks.begin(), ranks.end(), core_wait), end; m != end; ++m) {
    ++waits;
    EXPECT_LE(std::stod((*m)[2]), std::stod((*m)[1]) + 0.005) << (*m)[0];
  }
  EXPECT_EQ(waits, 2) << ranks;
  const v1::JobStatus status = GetJob(id);
  EXPECT_EQ(status.progress().collective_plane(), "shm");
  const auto& phases = status.progress().phase_seconds();
  for (const char* phase :
       {"placement", "setup", "group", "first_step", "train", "validation", "checkpoint", "test"}) {
    EXPECT_TRUE(phases.count(phase)) << phase;
  }
  EXPECT_GT(phases.at("train"), 0.0);
  EXPECT_LE(phases.at("group"), phases.at("setup")) << "group formation is part of setup";
  EXPECT_GE(phases.at("first_step"), phases.at("setup"));
  // Per-rank accounting: each rank's time in steps, within the train phase, and its wait for
  // gradients within that.
  {
    const std::regex rank_line(R"(rank (\d) ([0-9.]+) s in steps, ([0-9.]+) s \([0-9.]+%\) of it)");
    std::set<int> ranks;
    for (std::sregex_iterator it(logs.output.begin(), logs.output.end(), rank_line), end; it != end;
         ++it) {
      const double in_steps = std::stod((*it)[2]), waiting = std::stod((*it)[3]);
      ranks.insert(std::stoi((*it)[1]));
      EXPECT_GT(in_steps, 0.0);
      EXPECT_LE(in_steps, phases.at("train") + 0.01);
      EXPECT_LE(waiting, in_steps);
    }
    EXPECT_EQ(ranks, (std::set<int>{0, 1})) << logs.output;
    // Milliseconds, both: the coordinator's share of a short job is well under 1% of its span,
    // so scripts comparing planes (bench/slow_samples.sh) need more than hundredths of a second.
    const std::regex between(
        R"(between steps \(the coordinator\) (\d+\.\d{3}) s of (\d+\.\d{3}) s)");
    std::smatch m;
    ASSERT_TRUE(std::regex_search(logs.output, m, between)) << logs.output;
    EXPECT_LE(std::stod(m[1]), std::stod(m[2]));
    EXPECT_NEAR(std::stod(m[2]), phases.at("train"), 0.001);
  }
  const double wall = (status.finished_unix_ms() - status.submitted_unix_ms()) / 1000.0;
  EXPECT_LE(phases.at("setup") + phases.at("train") + phases.at("validation") +
                phases.at("checkpoint") + phases.at("test"),
            wall + 0.05)
      << "the phases do not overlap";
  CommandResult shown = Dtrain("status " + id);
  EXPECT_THAT(shown.output, HasSubstr("collective plane: shm\n"));
  EXPECT_THAT(shown.output, HasSubstr("time by phase: placement "));
  CommandResult list = Dtrain("list");
  EXPECT_THAT(list.output, HasSubstr("synth-1"));
  EXPECT_THAT(list.output, HasSubstr("SUCCEEDED"));
  CommandResult workers = Dtrain("workers");
  EXPECT_THAT(workers.output, HasSubstr("w0"));
  EXPECT_THAT(workers.output, HasSubstr("ALIVE"));
}

// collective_backend auto falls back to the coordinator's collectives when Gloo cannot connect
// the peers, and says so; here w2 names its machine otherwise (--host, as on another host: no
// shared memory with w0) and its Gloo is given an interface that does not exist (as a
// GLOO_SOCKET_IFNAME typo would), so its side fails at once and w0's times out connecting.
TEST_F(JobsE2eTest, AutoPlane_GlooCannotConnect_FallsBackToGrpcAndSaysWhy) {
  cluster_->worker("w1").Stop();
  ASSERT_TRUE(cluster_->AddWorker("w2", {"--host=elsewhere"},
                                  {"/usr/bin/env", "GLOO_SOCKET_IFNAME=nonexistent0"}));
  ASSERT_TRUE(WaitFor([&] { return IdleWorkers() == 2; }, absl::Seconds(15)));
  const std::string spec = absl::StrReplaceAll(
      SyntheticJob("fallback", 1, 512),
      {{"  strategy: ddp\n", "  strategy: ddp\n  collective_timeout_ms: 5000\n"}});
  const std::string job = WriteJob("fallback", spec);
  CommandResult submitted = Dtrain(absl::StrCat("fit --wait --config ", job));
  ASSERT_EQ(submitted.exit_code, 0) << submitted.output;
  CommandResult logs = Dtrain("logs fallback-1");
  EXPECT_THAT(logs.output, HasSubstr("peer-to-peer collectives are not possible"));
  EXPECT_THAT(logs.output, HasSubstr("nonexistent0"));
  EXPECT_THAT(logs.output, HasSubstr("falling back to the coordinator's grpc collectives"));
  const v1::JobStatus status = GetJob("fallback-1");
  EXPECT_EQ(status.state(), v1::SUCCEEDED);
  // The ranks are on two "hosts", so nothing goes through shared memory, and w2's names it.
  EXPECT_EQ(status.progress().collective_plane(), "grpc");
  EXPECT_THAT(logs.output, HasSubstr("runs on another host ("));
  EXPECT_THAT(logs.output, HasSubstr("elsewhere/"));
  EXPECT_GT(status.metrics().at("test_acc"), 0.5);
  // w0 waits for w2's Gloo address for the connect budget (the collective timeout, 5 s), and
  // no longer: neither five budgets (Gloo's own multiplier) nor a wait for a verdict on w1.
  const double group = status.progress().phase_seconds().at("group");
  EXPECT_GE(group, 4.9) << "w0 gave up before its 5 s connect budget";
  EXPECT_LT(group, 11.0) << "the fallback took more than the 5 s connect budget and 6 s of slack";
}

// bf16-true's gradient buckets are bf16: on one host the shm plane reduces them itself (Gloo's CPU
// all_reduce refuses bf16), and the job trains.
TEST_F(JobsE2eTest, Bf16TrueDdpOnOneHost_ReducesThroughSharedMemory) {
  const std::string spec =
      absl::StrReplaceAll(SyntheticJob("bf16", 1, 512),
                          {{"  strategy: ddp\n", "  strategy: ddp\n  precision: bf16-true\n"}});
  CommandResult submitted = Dtrain(absl::StrCat("fit --wait --config ", WriteJob("bf16", spec)));
  ASSERT_EQ(submitted.exit_code, 0) << submitted.output;
  const v1::JobStatus status = GetJob("bf16-1");
  EXPECT_EQ(status.state(), v1::SUCCEEDED) << status.reason();
  EXPECT_EQ(status.progress().collective_plane(), "shm");
  EXPECT_GT(status.metrics().at("test_acc"), 0.5);
}

// Workers pinned to cores (--cpus): the job runs, and its log says where each rank's steps run.
TEST_F(JobsE2eTest, PinnedWorkers_TheJobLogNamesEachRanksCores) {
  const std::string allowed = CpusAllowedList("/proc/self/status");
  // The first core this process may use (the list starts with it: "0-1", "3,5", "2-7,9").
  const std::string core = allowed.substr(0, allowed.find_first_of(",-"));
  ASSERT_FALSE(core.empty()) << allowed;
  cluster_->worker("w0").Stop();
  cluster_->worker("w1").Stop();
  ASSERT_TRUE(cluster_->AddWorker("p0", {"--cpus=" + core}));
  ASSERT_TRUE(cluster_->AddWorker("p1", {"--cpus=" + core}));
  ASSERT_TRUE(WaitFor([&] { return IdleWorkers() == 2; }, absl::Seconds(15)));
  CommandResult submitted = Dtrain(
      absl::StrCat("fit --wait --config ", WriteJob("pinned", SyntheticJob("pinned", 1, 256))));
  ASSERT_EQ(submitted.exit_code, 0) << submitted.output;
  CommandResult logs = Dtrain("logs pinned-1");
  EXPECT_THAT(logs.output, HasSubstr(absl::StrCat("(node 0, local 0, cpus ", core, ")")));
  EXPECT_THAT(logs.output, HasSubstr(absl::StrCat("(node 0, local 1, cpus ", core, ")")));
  EXPECT_EQ(GetJob("pinned-1").state(), v1::SUCCEEDED);
}

// Workers started without --cpus (auto, the default) learn of each other from the coordinator
// and split this host's cores, one slice each in name order; the job's ranks run there; when
// one leaves, the other takes its cores back.
TEST_F(JobsE2eTest, AutoPlacedWorkers_SplitTheCores_TakeThemBackWhenOneLeaves) {
  const std::string allowed_list = CpusAllowedList("/proc/self/status");
  absl::StatusOr<std::vector<int>> allowed = ParseCpuList(allowed_list);
  ASSERT_TRUE(allowed.ok()) << allowed_list;
  if (allowed->size() < 2) GTEST_SKIP() << "two workers need two cores to split";
  const std::string first = FormatCpuList(CpusOfLocalProcess(*allowed, 0, 2));
  const std::string second = FormatCpuList(CpusOfLocalProcess(*allowed, 1, 2));
  cluster_->worker("w0").Stop();
  cluster_->worker("w1").Stop();
  ASSERT_TRUE(cluster_->AddWorker("a0", {"--cpus=auto"}));
  ASSERT_TRUE(cluster_->AddWorker("a1", {"--cpus=auto"}));
  auto placed = [&](const std::string& name) {
    for (const v1::WorkerInfo& w : cluster_->Workers()) {
      if (w.name() == name && w.state() == v1::WorkerInfo::ALIVE) return w;
    }
    return v1::WorkerInfo();
  };
  ASSERT_TRUE(WaitFor([&] { return placed("a0").cpus() == first && placed("a1").cpus() == second; },
                      absl::Seconds(15)))
      << "a0 on '" << placed("a0").cpus() << "', a1 on '" << placed("a1").cpus() << "'";
  EXPECT_TRUE(placed("a0").cpus_auto());
  EXPECT_EQ(placed("a0").allowed_cpus(), FormatCpuList(*allowed));
  EXPECT_EQ(placed("a1").threads(), 1) << "--threads=1, below the slice";
  ASSERT_TRUE(WaitFor([&] { return IdleWorkers() == 2; }, absl::Seconds(15)));
  CommandResult submitted =
      Dtrain(absl::StrCat("fit --wait --config ", WriteJob("auto", SyntheticJob("auto", 1, 256))));
  ASSERT_EQ(submitted.exit_code, 0) << submitted.output;
  CommandResult logs = Dtrain("logs auto-1");
  EXPECT_THAT(logs.output, HasSubstr(absl::StrCat("(node 0, local 0, cpus ", first, ")")));
  EXPECT_THAT(logs.output, HasSubstr(absl::StrCat("(node 0, local 1, cpus ", second, ")")));
  EXPECT_EQ(GetJob("auto-1").state(), v1::SUCCEEDED);
  CommandResult listed = Dtrain("workers");
  EXPECT_THAT(listed.output, HasSubstr(absl::StrCat(first, "/1t auto")));
  cluster_->worker("a1").Stop();
  EXPECT_TRUE(
      WaitFor([&] { return placed("a0").cpus() == FormatCpuList(*allowed); }, absl::Seconds(15)))
      << "a0 alone stays on '" << placed("a0").cpus() << "'";
}

// Early stopping: a min_delta no improvement can meet stops the run after `patience`
// validations; then a new job resumes from its last checkpoint exactly after its last step.
TEST_F(JobsE2eTest, EarlyStoppingThenResumeFromTheCheckpoint) {
  const std::string stopping = SyntheticJob("stop", 10) +
                               "early_stopping: {monitor: val_loss, min_delta: 100, patience: 2}\n";
  CommandResult stopped = Dtrain("fit --wait --config " + WriteJob("stop", stopping));
  ASSERT_EQ(stopped.exit_code, 0) << stopped.output;
  const v1::JobStatus first = GetJob("stop-1");
  // Validations at steps 16 (the first sets the best), 32 (1 without improvement), 48 (2): stop.
  EXPECT_EQ(first.progress().global_step(), 48);
  EXPECT_EQ(first.progress().total_steps(), 320);
  CommandResult logs = Dtrain("logs stop-1");
  EXPECT_THAT(logs.output,
              HasSubstr("early stopping: val_loss did not improve by 100 for 2 validations"));
  EXPECT_THAT(logs.output, HasSubstr("test: test_acc="));

  CommandResult status = Dtrain("status stop-1");
  EXPECT_THAT(status.output, HasSubstr("checkpoint: "));
  const std::string checkpoint = first.checkpoint();
  ASSERT_TRUE(absl::EndsWith(checkpoint, "/last.ckpt")) << checkpoint;
  const std::string resumed = SyntheticJob("resumed", 2) + "ckpt_path: " + checkpoint + "\n";
  CommandResult second = Dtrain("fit --wait --config " + WriteJob("resumed", resumed));
  ASSERT_EQ(second.exit_code, 0) << second.output;
  CommandResult resumed_logs = Dtrain("logs resumed-1");
  EXPECT_THAT(resumed_logs.output, HasSubstr("at step 48 (epoch 1, batch 16)"));
  EXPECT_EQ(GetJob("resumed-1").progress().global_step(), 64) << "2 epochs of 32 steps, 48 done";
  EXPECT_GT(GetJob("resumed-1").metrics().at("test_acc"), 0.9);

  // A truncated checkpoint (a crash mid-write) in a directory the workers share: the resume says
  // so and falls back to the newest other checkpoint of the directory, which loads. The
  // directory holds the job's files as `dtrain download` brings them back.
  const std::string shared = dir() + "/shared-ckpts";
  CommandResult downloaded = Dtrain("download stop-1 -o " + shared);
  ASSERT_EQ(downloaded.exit_code, 0) << downloaded.output;
  const std::string truncated = shared + "/truncated.ckpt";
  std::filesystem::copy_file(shared + "/last.ckpt", truncated);
  std::filesystem::resize_file(truncated, std::filesystem::file_size(truncated) / 2);
  std::filesystem::last_write_time(truncated, std::filesystem::file_time_type::clock::now());
  CommandResult fallback = Dtrain(
      "fit --wait --config " +
      WriteJob("fallback", SyntheticJob("fallback", 2) + "ckpt_path: worker:" + truncated + "\n"));
  ASSERT_EQ(fallback.exit_code, 0) << fallback.output;
  CommandResult fallback_logs = Dtrain("logs fallback-1");
  EXPECT_THAT(fallback_logs.output,
              HasSubstr("checkpoint worker:" + truncated + " is unreadable ("));
  EXPECT_THAT(fallback_logs.output, HasSubstr("resuming from " + shared + "/"));
  EXPECT_THAT(fallback_logs.output, HasSubstr(".ckpt instead of worker:" + truncated));
  EXPECT_EQ(GetJob("fallback-1").progress().global_step(), 64);
  // Sent with the job instead, the truncated file has no directory to fall back in: the job
  // fails naming it as the spec does.
  CommandResult sent =
      Dtrain("fit --wait --config " +
             WriteJob("sent", SyntheticJob("sent", 2) + "ckpt_path: " + truncated + "\n"));
  EXPECT_EQ(sent.exit_code, 1) << sent.output;
  EXPECT_THAT(sent.output, HasSubstr("ckpt_path: truncated.ckpt ("));
  EXPECT_THAT(sent.output, HasSubstr("FAILED: load_checkpoint failed on worker 'w"));
  EXPECT_THAT(sent.output, HasSubstr("artifact:sha256:"));
  EXPECT_THAT(sent.output, HasSubstr("is not a checkpoint"));
  std::filesystem::remove(truncated);

  // trainer.validate and trainer.predict from that checkpoint: no training steps.
  const std::string validate = SyntheticJob("check", 1) + "ckpt_path: " + checkpoint + "\n";
  CommandResult validated = Dtrain("validate --wait --config " + WriteJob("check", validate));
  ASSERT_EQ(validated.exit_code, 0) << validated.output;
  EXPECT_EQ(GetJob("check-1").progress().global_step(), 48);
  EXPECT_GT(GetJob("check-1").metrics().at("val_acc"), 0.9);
  EXPECT_EQ(GetJob("check-1").metrics().count("train_loss"), 0u);
  // One batch per call: predict's outputs come back over several calls, still in order.
  std::string predict = SyntheticJob("guess", 1) + "ckpt_path: " + checkpoint + "\n";
  predict.replace(predict.find("  num_nodes: 2\n"), 15, "  num_nodes: 2\n  batches_per_call: 1\n");
  CommandResult predicted = Dtrain("predict --wait --config " + WriteJob("guess", predict));
  ASSERT_EQ(predicted.exit_code, 0) << predicted.output;
  const std::string csv_path = GetJob("guess-1").predictions();
  std::ifstream csv(csv_path);
  std::string header;
  std::getline(csv, header);
  EXPECT_EQ(header, "index,label") << csv_path;
  int rows = 0;
  for (std::string line; std::getline(csv, line); ++rows) {
    const std::vector<std::string> cells = absl::StrSplit(line, ',');
    ASSERT_EQ(cells.size(), 2u) << line;
    EXPECT_EQ(cells[0], std::to_string(rows)) << "one row per test sample, in order";
    EXPECT_TRUE(cells[1].size() == 1 && cells[1][0] >= '0' && cells[1][0] <= '9') << line;
  }
  EXPECT_EQ(rows, 512);
  // The predictions came home too: the same bytes, downloaded and verified.
  CommandResult fetched = Dtrain("download guess-1 predictions -o " + dir() + "/preds");
  ASSERT_EQ(fetched.exit_code, 0) << fetched.output;
  EXPECT_EQ(ReadFile(dir() + "/preds/predictions.csv"), ReadFile(csv_path));
}

// trainer.test_ckpt_path: best tests the best checkpoint, not the weights fit ended with. The
// monitor is made to prefer the first validation (the highest val_loss), so best and last differ;
// a test stage from that checkpoint gives the same test metrics.
TEST_F(JobsE2eTest, TestCkptPathBest_TestsTheBestCheckpoint) {
  std::string spec = SyntheticJob("pick", 1);
  spec.replace(spec.find("  num_nodes: 2\n"), 15, "  num_nodes: 2\n  test_ckpt_path: best\n");
  const std::string monitor = "checkpoint: {monitor: val_acc,";
  spec.replace(spec.find(monitor), monitor.size(), "checkpoint: {monitor: val_loss, mode: max,");
  CommandResult run = Dtrain("fit --wait --config " + WriteJob("pick", spec));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const v1::JobStatus job = GetJob("pick-1");
  ASSERT_TRUE(absl::EndsWith(job.best_checkpoint(), "/epoch=0-step=16.ckpt"))
      << job.best_checkpoint();
  EXPECT_THAT(Dtrain("logs pick-1").output,
              HasSubstr("testing the best checkpoint " + job.best_checkpoint()));

  const std::string test = SyntheticJob("retest", 1) + "ckpt_path: " + job.best_checkpoint() + "\n";
  CommandResult tested = Dtrain("test --wait --config " + WriteJob("retest", test));
  ASSERT_EQ(tested.exit_code, 0) << tested.output;
  const v1::JobStatus retest = GetJob("retest-1");
  EXPECT_NEAR(job.metrics().at("test_loss"), retest.metrics().at("test_loss"), 1e-6);
  EXPECT_DOUBLE_EQ(job.metrics().at("test_acc"), retest.metrics().at("test_acc"));

  // The weights fit ended with test differently: the best really was loaded.
  const std::string last = SyntheticJob("final", 1) + "ckpt_path: " + job.checkpoint() + "\n";
  CommandResult final_run = Dtrain("test --wait --config " + WriteJob("final", last));
  ASSERT_EQ(final_run.exit_code, 0) << final_run.output;
  EXPECT_GT(std::abs(GetJob("final-1").metrics().at("test_loss") - job.metrics().at("test_loss")),
            1e-4);

  // An unknown choice is refused at submit with the field's path.
  std::string bad = SyntheticJob("bad", 1);
  bad.replace(bad.find("  num_nodes: 2\n"), 15, "  num_nodes: 2\n  test_ckpt_path: worst\n");
  CommandResult refused = Dtrain("fit --config " + WriteJob("bad", bad));
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_THAT(refused.output, HasSubstr("trainer.test_ckpt_path: unknown test checkpoint 'worst'"));
}

TEST_F(JobsE2eTest, AccumulationWindowsCloseAtEachEpochsEnd) {
  std::string spec = SyntheticJob("acc", 2);
  spec.replace(spec.find("  num_nodes: 2\n"), 15, "  num_nodes: 2\n  accumulate_grad_batches: 3\n");
  CommandResult run = Dtrain("fit --wait --config " + WriteJob("acc", spec));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const v1::JobStatus job = GetJob("acc-1");
  EXPECT_EQ(job.progress().total_steps(), 22);
  EXPECT_EQ(job.progress().global_step(), 22);
  EXPECT_GT(job.metrics().at("test_acc"), 0.9);
}

// Batches per training call: by default sized from the time calls take (a fast model's calls
// grow past the 16 of the first call, so the job needs far fewer round trips); fixed when the
// spec names a number. The job log says which, and how many calls the training took.
TEST_F(JobsE2eTest, BatchesPerCall_AutoGrowsForFastSteps_FixedIsKept) {
  // 12,800 samples, batch 32, 2 ranks: 200 batches per rank in one epoch, no validation inside.
  auto job = [](const std::string& name, const std::string& per_call) {
    std::string spec = SyntheticJob(name, 1, 12800);
    spec.replace(spec.find("  val_check_interval: 0.5\n"), 26, "  val_check_interval: 1.0\n");
    if (!per_call.empty()) {
      spec.replace(spec.find("  num_nodes: 2\n"), 15,
                   absl::StrCat("  num_nodes: 2\n  batches_per_call: ", per_call, "\n"));
    }
    return spec;
  };
  const std::regex calls_line(R"(in (\d+) training calls \(batches per call: ([^)]*)\))");
  std::smatch match;

  ASSERT_EQ(Dtrain("fit --wait --config " + WriteJob("auto", job("auto", ""))).exit_code, 0);
  const std::string auto_log = Dtrain("logs auto-1").output;
  ASSERT_TRUE(std::regex_search(auto_log, match, calls_line)) << auto_log;
  // 16 per call would take 13 calls; sized calls take 16, 16 (sent before the first answered),
  // 64, then the 104 left (the MLP on synthetic data steps in well under the 4 ms a batch that
  // growing to 64 needs), or a few more on a machine slowed down.
  EXPECT_LT(std::stoi(match[1]), 13) << auto_log;
  const std::string sized = match[2];
  ASSERT_TRUE(absl::StartsWith(sized, "auto, up to ")) << sized;
  EXPECT_GT(std::stoi(sized.substr(12)), 16) << sized;
  EXPECT_EQ(GetJob("auto-1").progress().global_step(), 200);

  ASSERT_EQ(Dtrain("fit --wait --config " + WriteJob("fixed", job("fixed", "8"))).exit_code, 0);
  const std::string fixed_log = Dtrain("logs fixed-1").output;
  ASSERT_TRUE(std::regex_search(fixed_log, match, calls_line)) << fixed_log;
  EXPECT_EQ(std::stoi(match[1]), 25) << "200 batches, 8 per call";
  EXPECT_EQ(match[2], "8");
  EXPECT_EQ(GetJob("fixed-1").progress().global_step(), 200);
  // Every call after the first went out before the one ahead of it answered.
  EXPECT_THAT(fixed_log, HasSubstr("(batches per call: 8), 24 pipelined")) << fixed_log;

  // One call at a time (trainer.pipelined_calls: false) trains the same model, bit for bit.
  std::string one = job("one", "8");
  one.replace(one.find("  num_nodes: 2\n"), 15, "  num_nodes: 2\n  pipelined_calls: false\n");
  ASSERT_EQ(Dtrain("fit --wait --config " + WriteJob("one", one)).exit_code, 0);
  const std::string one_log = Dtrain("logs one-1").output;
  EXPECT_THAT(one_log, HasSubstr("25 training calls (batches per call: 8)\n")) << one_log;
  EXPECT_THAT(one_log, ::testing::Not(HasSubstr("pipelined"))) << one_log;
  const v1::JobStatus pipelined = GetJob("fixed-1");
  const v1::JobStatus one_at_a_time = GetJob("one-1");
  ASSERT_FALSE(pipelined.metrics().empty());
  for (const auto& [name, value] : pipelined.metrics()) {
    ASSERT_EQ(one_at_a_time.metrics().count(name), 1u) << name;
    EXPECT_EQ(one_at_a_time.metrics().at(name), value) << name;
  }
}

// Training calls name their batches by the sampler and each worker deals its rank's (the
// default), or the coordinator lists every index, as it does for workers that deal otherwise
// (trainer.sampled_calls: false takes that path with today's workers). Both train the same model
// bit for bit over shuffled epochs, and the job's log says when and why the calls list.
TEST_F(JobsE2eTest, SampledCallsOrListedOnes_TrainTheSameModel_BitForBit) {
  const std::string sampled = SyntheticJob("sampled", 2);
  std::string listed = SyntheticJob("listed", 2);
  listed.replace(listed.find("  num_nodes: 2\n"), 15, "  num_nodes: 2\n  sampled_calls: false\n");
  ASSERT_EQ(Dtrain("fit --wait --config " + WriteJob("sampled", sampled)).exit_code, 0);
  ASSERT_EQ(Dtrain("fit --wait --config " + WriteJob("listed", listed)).exit_code, 0);
  const std::string sampled_log = Dtrain("logs sampled-1").output;
  const std::string listed_log = Dtrain("logs listed-1").output;
  EXPECT_THAT(sampled_log, ::testing::Not(HasSubstr("list every rank's"))) << sampled_log;
  EXPECT_THAT(listed_log, HasSubstr("training calls list every rank's sample indices: "
                                    "trainer.sampled_calls is false"))
      << listed_log;
  const v1::JobStatus a = GetJob("sampled-1");
  const v1::JobStatus b = GetJob("listed-1");
  EXPECT_EQ(a.state(), v1::SUCCEEDED);
  EXPECT_EQ(b.state(), v1::SUCCEEDED);
  EXPECT_EQ(b.progress().global_step(), a.progress().global_step());
  ASSERT_GT(a.metrics().count("test_acc"), 0u);
  ASSERT_GT(a.metrics().count("train_loss"), 0u);
  for (const auto& [name, value] : a.metrics()) {
    ASSERT_EQ(b.metrics().count(name), 1u) << name;
    EXPECT_EQ(b.metrics().at(name), value) << name;
  }
}

TEST_F(JobsE2eTest, Cancel_StopsEveryWorkerWithinFiveSeconds_AndTheQueuedJobRuns) {
  // Long enough never to finish by itself; a second job waits behind it for the workers.
  CommandResult first =
      Dtrain("fit --output json --config " + WriteJob("long", SyntheticJob("long", 1000, 8192)));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const std::string id = ParseJson(first.output).fields().at("id").string_value();
  CommandResult second =
      Dtrain("fit --output json --config " + WriteJob("next", SyntheticJob("next", 1)));
  ASSERT_EQ(second.exit_code, 0) << second.output;
  const std::string next_id = ParseJson(second.output).fields().at("id").string_value();
  ASSERT_TRUE(WaitFor([&] { return GetJob(id).progress().global_step() > 20; }, absl::Seconds(30)));
  EXPECT_EQ(GetJob(next_id).state(), v1::QUEUED);

  // The five seconds count from the cancel's answer: starting the CLI process is not the
  // runtime's latency, and on a loaded CI machine it can take a second by itself.
  CommandResult cancelled = Dtrain("cancel " + id);
  const absl::Time start = absl::Now();
  ASSERT_EQ(cancelled.exit_code, 0) << cancelled.output;
  ASSERT_TRUE(WaitFor([&] { return GetJob(id).state() == v1::CANCELLED; }, absl::Seconds(5)));
  // Every worker's step stopped and its job was torn down: Health says so at once.
  for (const char* name : {"w0", "w1"}) {
    ASSERT_TRUE(WaitFor(
        [&] {
          grpc::ClientContext context;
          v1::HealthResponse health;
          cluster_->worker(name).stub().Health(&context, v1::HealthRequest(), &health);
          return health.state() == v1::HealthResponse::IDLE || health.job_id() == next_id;
        },
        absl::Seconds(5) - (absl::Now() - start)));
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_THAT(GetJob(id).reason(), HasSubstr("cancelled"));
  // The freed workers take the queued job.
  ASSERT_TRUE(WaitFor([&] { return GetJob(next_id).state() == v1::SUCCEEDED; }, absl::Seconds(60)))
      << v1::JobState_Name(GetJob(next_id).state()) << " " << GetJob(next_id).reason();
  CommandResult again = Dtrain("cancel " + id);
  EXPECT_EQ(again.exit_code, 3);
  EXPECT_THAT(again.output, HasSubstr("already ended"));
}

}  // namespace jobs_e2e_test
}  // namespace dtrain::testing
