// The dtrain command line's contract end to end against a real local cluster, as scripts rely on
// it (docs/jobs.md's table): --help and exit codes, errors as JSON and watch streams as JSON
// Lines, overrides; specs refused at submit with the field's path, by the client and by the
// coordinator; and --dry-run's one step on an idle worker, which queues nothing.
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <google/protobuf/struct.pb.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "dtrain/v1/jobs.grpc.pb.h"
#include "tests/jobs_e2e_fixture.h"
#include "tests/local_cluster.h"

namespace dtrain::testing {
namespace jobs_command_line_e2e_test {

using ::testing::HasSubstr;
using ::testing::Not;

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

}  // namespace jobs_command_line_e2e_test
}  // namespace dtrain::testing
