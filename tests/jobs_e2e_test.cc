// Jobs end to end against a real local cluster: a dtrain-coordinator and two dtrain-worker
// processes on 127.0.0.1, driven by the dtrain command line as a user would (submit, watch,
// results, logs, list, cancel), on small synthetic data.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include <gmock/gmock.h>
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "dtrain/v1/jobs.grpc.pb.h"
#include "tests/jobs_e2e_fixture.h"
#include "tests/local_cluster.h"
#include "worker/runtime/cpu_affinity.h"

namespace dtrain::testing {
namespace jobs_e2e_test {

using ::testing::HasSubstr;
using ::testing::Not;

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
    EXPECT_THAT(logs.output, HasSubstr("between steps (the coordinator) "));
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
// the peers, and says so; here w1's Gloo is given an interface that does not exist (as a
// GLOO_SOCKET_IFNAME typo would), so its side fails at once and w0's times out connecting.
TEST_F(JobsE2eTest, AutoPlane_GlooCannotConnect_FallsBackToGrpcAndSaysWhy) {
  cluster_->worker("w1").Stop();
  ASSERT_TRUE(cluster_->AddWorker("w2", {}, {"/usr/bin/env", "GLOO_SOCKET_IFNAME=nonexistent0"}));
  ASSERT_TRUE(WaitFor([&] { return IdleWorkers() == 2; }, absl::Seconds(15)));
  const std::string spec = absl::StrReplaceAll(
      SyntheticJob("fallback", 1, 512),
      {{"  strategy: ddp\n", "  strategy: ddp\n  collective_timeout_ms: 5000\n"}});
  const std::string job = WriteJob("fallback", spec);
  const absl::Time start = absl::Now();
  CommandResult submitted = Dtrain(absl::StrCat("fit --wait --config ", job));
  ASSERT_EQ(submitted.exit_code, 0) << submitted.output;
  EXPECT_LT(absl::ToDoubleSeconds(absl::Now() - start), 40.0)
      << "the fallback waits the connect timeout (5 s here), not the collective timeout";
  CommandResult logs = Dtrain("logs fallback-1");
  EXPECT_THAT(logs.output, HasSubstr("peer-to-peer collectives are not possible"));
  EXPECT_THAT(logs.output, HasSubstr("nonexistent0"));
  EXPECT_THAT(logs.output, HasSubstr("falling back to the coordinator's grpc collectives"));
  const v1::JobStatus status = GetJob("fallback-1");
  EXPECT_EQ(status.state(), v1::SUCCEEDED);
  // Both ranks are on this host, so all_reduce still goes through shared memory; the rest
  // (broadcast, gathers) through the coordinator.
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

// The contract scripts rely on (docs/jobs.md's table): --help exits 0 on all three binaries
// and lists every flag; usage errors exit 2; with --output json errors are JSON on stdout and
// watch streams one object per line; the coordinator's refusals exit 3.
TEST_F(JobsE2eTest, CommandLine_ExitCodesHelpAndJsonLines) {
  CommandResult help = Dtrain("--help");
  EXPECT_EQ(help.exit_code, 0) << help.output;
  for (const char* flag : {"--coordinator", "--token", "--token_file", "--timeout", "--output",
                           "--tls_ca", "--print_config", "--dry_run", "--wait", "--follow"}) {
    EXPECT_THAT(help.output, HasSubstr(absl::StrCat("  ", flag, "  "))) << flag;
  }
  for (const char* binary : {DTRAIN_COORDINATOR_BIN, DTRAIN_WORKER_BIN}) {
    CommandResult daemon_help = RunShell(absl::StrCat(binary, " --help"));
    EXPECT_EQ(daemon_help.exit_code, 0) << binary;
    EXPECT_THAT(daemon_help.output, HasSubstr("  --token_file  ")) << binary;
    EXPECT_EQ(RunShell(absl::StrCat(binary, " --no_such_flag")).exit_code, 2) << binary;
  }

  EXPECT_EQ(Dtrain("list --bogus").exit_code, 2);
  CommandResult json_usage = Dtrain("list --output json --bogus");
  EXPECT_EQ(json_usage.exit_code, 2);
  EXPECT_EQ(json_usage.output.find("{\"e"), 0u) << json_usage.output;
  const google::protobuf::Struct usage = ParseJsonLine(json_usage.output);
  EXPECT_EQ(usage.fields().at("error").struct_value().fields().at("code").string_value(),
            "INVALID_ARGUMENT");
  EXPECT_THAT(usage.fields().at("error").struct_value().fields().at("message").string_value(),
              HasSubstr("unknown flag --bogus"));
  EXPECT_EQ(usage.fields().at("exit_code").number_value(), 2);
  CommandResult old = Dtrain("submit job.yaml");
  EXPECT_EQ(old.exit_code, 2);
  EXPECT_THAT(old.output, HasSubstr("dtrain fit --config job.yaml"));
  CommandResult no_config = Dtrain("fit");
  EXPECT_EQ(no_config.exit_code, 2);
  EXPECT_THAT(no_config.output, HasSubstr("give --config FILE"));

  CommandResult missing = Dtrain("status nope-1 --output json");
  EXPECT_EQ(missing.exit_code, 3);
  EXPECT_EQ(ParseJsonLine(missing.output)
                .fields()
                .at("error")
                .struct_value()
                .fields()
                .at("code")
                .string_value(),
            "NOT_FOUND");

  // A spec refused by the client: exit 2 and the override's path.
  const std::string job = WriteJob("lines", SyntheticJob("lines", 3));
  CommandResult typo = Dtrain("fit --output json --config " + job + " --trainer.max_epochs=two");
  EXPECT_EQ(typo.exit_code, 2);
  EXPECT_THAT(typo.output, HasSubstr("--trainer.max_epochs: trainer.max_epochs: expected an "
                                     "integer, got 'two'"));

  // Overrides reach the job: 1 epoch instead of the file's 3; the stream is JSON Lines.
  CommandResult run =
      Dtrain("fit --wait --output json --config " + job + " --trainer.max_epochs 1 --name=lines");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const std::vector<std::string> lines = absl::StrSplit(run.output, '\n', absl::SkipEmpty());
  ASSERT_GE(lines.size(), 3u) << run.output;
  int updates = 0;
  for (const std::string& line : lines) {
    if (line.rfind("{", 0) != 0) continue;  // the cluster's own log lines share the output
    const google::protobuf::Struct update = ParseJsonLine(line);
    EXPECT_EQ(update.fields().at("id").string_value(), "lines-1") << line;
    ++updates;
  }
  EXPECT_GE(updates, 3) << "the submission, progress, the end";
  const v1::JobStatus done = GetJob("lines-1");
  EXPECT_EQ(done.state(), v1::SUCCEEDED);
  EXPECT_EQ(done.progress().max_epochs(), 1);
  EXPECT_EQ(done.progress().global_step(), 32);
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
  // 16 per call would take 13 calls; sized calls take 16, 64, then the 120 left (the MLP on
  // synthetic data steps in well under the 4 ms a batch that growing to 64 needs), or a few
  // more on a machine slowed down.
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
}

TEST_F(JobsE2eTest, InvalidSpec_RejectedAtSubmitWithItsPath) {
  CommandResult unknown = Dtrain("fit --config " + WriteJob("bad1", "trainer: {max_epoch: 2}\n"));
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_THAT(unknown.output, HasSubstr("trainer.max_epoch: unknown key"));
  CommandResult value =
      Dtrain("fit --config " +
             WriteJob("bad2", SyntheticJob("b", 1) + "early_stopping: {patience: -2}\n"));
  EXPECT_EQ(value.exit_code, 2);
  EXPECT_THAT(value.output, HasSubstr("early_stopping.patience: must be >= 1"));
  CommandResult missing = Dtrain("fit --config " + dir() + "/nope.yaml");
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_THAT(missing.output, HasSubstr("does not exist"));
  // The coordinator checks too: the proto is public API.
  grpc::ClientContext context;
  v1::SubmitJobRequest request;
  request.mutable_spec()->mutable_model()->set_builtin("mlp");
  request.mutable_spec()->mutable_data()->mutable_synthetic()->set_train_size(10);
  request.mutable_spec()->mutable_trainer()->set_strategy("fsdp9");
  v1::SubmitJobResponse response;
  grpc::Status status = cluster_->jobs().SubmitJob(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("trainer.strategy: unknown strategy 'fsdp9'"));
  CommandResult list = Dtrain("list --output json");
  EXPECT_THAT(list.output, Not(HasSubstr("\"id\""))) << "nothing was queued";
  CommandResult unknown_job = Dtrain("status no-such-job");
  EXPECT_EQ(unknown_job.exit_code, 3);
  EXPECT_THAT(unknown_job.output, HasSubstr("NOT_FOUND"));
}

// submit --dry-run: an idle worker loads the model and data and runs one training_step and
// one validation_step; it reports the batch and the returned keys, or libtorch's error naming
// the worker, and nothing is queued.
TEST_F(JobsE2eTest, DryRun_ReportsBatchAndKeys_OrTheModelsError_QueuesNothing) {
  CommandResult ok = Dtrain("fit --dry-run --config " + WriteJob("dry", SyntheticJob("dry", 1)));
  ASSERT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_THAT(ok.output, HasSubstr("dry run on worker 'w"));
  EXPECT_THAT(ok.output, HasSubstr("batch           tuple(float32[32, 1, 28, 28], int64[32])"));
  EXPECT_THAT(ok.output, HasSubstr("training_step   returns loss; loss "));
  EXPECT_THAT(ok.output, HasSubstr("validation_step returns acc, loss"));
  EXPECT_THAT(ok.output, HasSubstr("split train    2048 samples"));

  // Data the model cannot take: libtorch's message, naming the worker, before any queueing.
  const std::string data = dir() + "/narrow.pt";
  CommandResult made = RunShell(
      absl::StrCat("/usr/bin/python3 -c 'import torch; torch.save({\"train\": (torch.zeros(64, 5), "
                   "torch.zeros(64, dtype=torch.long))}, \"",
                   data, "\")'"));
  ASSERT_EQ(made.exit_code, 0) << made.output;
  std::string narrow = SyntheticJob("narrow", 1);
  narrow.replace(narrow.find("  synthetic: {"),
                 narrow.find("\n", narrow.find("  synthetic: {")) - narrow.find("  synthetic: {"),
                 "  tensors_file: " + data);
  CommandResult bad = Dtrain("fit --dry-run --config " + WriteJob("narrow", narrow));
  EXPECT_EQ(bad.exit_code, 3) << bad.output;
  EXPECT_THAT(bad.output, HasSubstr("dry run on worker 'w"));
  EXPECT_THAT(bad.output, HasSubstr("training_step of model 'builtin:mlp' failed"));
  CommandResult list = Dtrain("list --output json");
  EXPECT_THAT(list.output, Not(HasSubstr("\"id\""))) << "a dry run queues nothing";

  // Every worker busy: refused, saying why.
  CommandResult busy =
      Dtrain("fit --output json --config " + WriteJob("busy", SyntheticJob("busy", 1000, 8192)));
  ASSERT_EQ(busy.exit_code, 0) << busy.output;
  ASSERT_TRUE(WaitFor([&] { return IdleWorkers() == 0; }, absl::Seconds(30)));
  CommandResult none =
      Dtrain("fit --dry-run --config " + WriteJob("dry2", SyntheticJob("dry2", 1)));
  EXPECT_EQ(none.exit_code, 3) << none.output;
  EXPECT_THAT(none.output, HasSubstr("a dry run needs an idle worker"));
  EXPECT_EQ(Dtrain("cancel busy-1").exit_code, 0);
}

TEST_F(JobsE2eTest, ModelFailsOnWorker_JobFailedWithTheWorkersMessage_WorkersFreed) {
  // A path that is not a file here is refused at submit, unless marked as the workers' own.
  CommandResult local = Dtrain("fit --config " + WriteJob("unsent", R"(name: unsent
model: {torchscript: /nonexistent/model.pt}
data: {synthetic: {train_size: 64}}
)"));
  EXPECT_EQ(local.exit_code, 2) << local.output;
  EXPECT_THAT(local.output, HasSubstr("model.torchscript: '/nonexistent/model.pt' is not a file "
                                      "here, so it cannot be sent with the job; if it is already "
                                      "on every worker, write worker:/nonexistent/model.pt"));
  const std::string job = WriteJob("broken", R"(name: broken
model: {torchscript: "worker:/nonexistent/model.pt"}
data: {synthetic: {train_size: 64}}
trainer: {num_nodes: 2}
)");
  CommandResult failed = Dtrain("fit --wait --config " + job);
  EXPECT_EQ(failed.exit_code, 1) << failed.output;
  EXPECT_THAT(failed.output, HasSubstr("job broken-1 FAILED: setup failed on worker 'w"));
  EXPECT_THAT(failed.output, HasSubstr("model: model file '/nonexistent/model.pt' does not exist"));
  // The workers are free for the next job.
  CommandResult next = Dtrain("fit --wait --config " + WriteJob("after", SyntheticJob("after", 1)));
  EXPECT_EQ(next.exit_code, 0) << next.output;
}

// Fault injection: a worker SIGKILLed mid-epoch (dead), or SIGSTOPped (alive to the kernel,
// silent to everyone: a straggler). Either way the job fails within the heartbeat timeout (5 s
// here) naming the worker, the surviving worker is freed for the next job, and a stopped worker
// that comes back (SIGCONT) registers again and serves.
class JobsFaultTest : public JobsE2eTest, public ::testing::WithParamInterface<int> {};

TEST_P(JobsFaultTest, WorkerLostMidEpoch_JobFailsNamingIt_SurvivorServesTheNextJob) {
  const int signal = GetParam();
  // Sized calls pass step 20 in the first call; the loss lands in a training call, or in the
  // validation or checkpoint at step 64: any call must fail at the heartbeat timeout.
  const std::string victim = SyntheticJob("victim", 1000, 8192);
  CommandResult first = Dtrain("fit --output json --config " + WriteJob("victim", victim));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const std::string id = ParseJson(first.output).fields().at("id").string_value();
  ASSERT_TRUE(WaitFor([&] { return GetJob(id).progress().global_step() > 20; }, absl::Seconds(30)));
  const int64_t step_before = GetJob(id).progress().global_step();

  const absl::Time start = absl::Now();
  cluster_->worker("w1").process().Kill(signal);
  ASSERT_TRUE(WaitFor([&] { return GetJob(id).state() == v1::FAILED; }, absl::Seconds(30)));
  const absl::Duration took = absl::Now() - start;
  const v1::JobStatus failed = GetJob(id);
  std::printf("%s: FAILED after %s at step %lld (was %lld): %s\n", strsignal(signal),
              absl::FormatDuration(took).c_str(),
              static_cast<long long>(failed.progress().global_step()),
              static_cast<long long>(step_before), failed.reason().c_str());
  // heartbeat timeout + detection and teardown slack (a loaded CI machine's)
  EXPECT_LT(took, absl::Seconds(5 + 7));
  EXPECT_THAT(failed.reason(), HasSubstr("w1"));
  // No silent progress after the loss: the job did not report steps it could not have made.
  EXPECT_LT(failed.progress().global_step(), step_before + 200);

  // The survivor takes the next job (num_nodes 1) at once.
  std::string one = SyntheticJob("survivor", 1, 512);
  one.replace(one.find("num_nodes: 2"), 12, "num_nodes: 1");
  CommandResult next = Dtrain("fit --wait --config " + WriteJob("survivor", one));
  EXPECT_EQ(next.exit_code, 0) << next.output;

  if (signal == SIGSTOP) {
    // Back from the dead: it re-registers and is listed ALIVE and idle again.
    cluster_->worker("w1").process().Kill(SIGCONT);
    EXPECT_TRUE(WaitFor([&] { return IdleWorkers() == 2; }, absl::Seconds(20)));
  }
}

// A call that runs no collective (validation here) has no group to notice the silent rank: the
// registry's LOST transition must stop it, not gRPC's keepalive (~15 s).
TEST_P(JobsFaultTest, WorkerLostDuringValidation_JobFailsWithinTheHeartbeatTimeout) {
  const int signal = GetParam();
  // One short epoch, then a validation of 12,000 samples one at a time (seconds long).
  std::string job = SyntheticJob("slowval", 1, 256);
  job.replace(job.find("val_size: 256"), 13, "val_size: 12000");
  job.replace(job.find("  batch_size: 32\n"), 17, "  batch_size: 32\n  eval_batch_size: 1\n");
  job.replace(job.find("  val_check_interval: 0.5\n"), 26, "");
  CommandResult first = Dtrain("fit --output json --config " + WriteJob("slowval", job));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const std::string id = ParseJson(first.output).fields().at("id").string_value();
  ASSERT_TRUE(
      WaitFor([&] { return GetJob(id).progress().phase() == "validate"; }, absl::Seconds(30)))
      << GetJob(id).DebugString();
  const absl::Time start = absl::Now();
  cluster_->worker("w1").process().Kill(signal);
  ASSERT_TRUE(WaitFor([&] { return GetJob(id).state() == v1::FAILED; }, absl::Seconds(30)))
      << GetJob(id).DebugString();
  const absl::Duration took = absl::Now() - start;
  const v1::JobStatus failed = GetJob(id);
  std::printf("%s during validation: FAILED after %s: %s\n", strsignal(signal),
              absl::FormatDuration(took).c_str(), failed.reason().c_str());
  // heartbeat timeout + detection slack, still short of gRPC's ~15 s keepalive
  EXPECT_LT(took, absl::Seconds(5 + 7));
  EXPECT_THAT(failed.reason(), HasSubstr("validation_step lost worker 'w1'"));

  if (signal == SIGSTOP) {
    EXPECT_THAT(failed.reason(), HasSubstr("no heartbeat for "));
    // The survivor was freed without waiting on the stopped worker's teardown, and the stopped
    // worker, continued, drops the job and serves again.
    cluster_->worker("w1").process().Kill(SIGCONT);
    EXPECT_TRUE(WaitFor([&] { return IdleWorkers() == 2; }, absl::Seconds(20)));
    CommandResult next =
        Dtrain("fit --wait --config " + WriteJob("after", SyntheticJob("after", 1)));
    EXPECT_EQ(next.exit_code, 0) << next.output;
  }
}

INSTANTIATE_TEST_SUITE_P(Signals, JobsFaultTest, ::testing::Values(SIGKILL, SIGSTOP),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::string(info.param == SIGKILL ? "Sigkill" : "Sigstop");
                         });

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
