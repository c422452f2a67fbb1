// Streamed shards end to end (issue 36): a real local cluster (a coordinator and two workers on
// 127.0.0.1) trains from WebDataset tar shards, driven by the dtrain command line: shards on the
// workers' disk ("worker:"), the client's own shards uploaded one by one, and bad data named by
// shard, sample and rank, or skipped and counted, with the workers left free for the next job.
// Then what streaming must keep: a job resumed mid-epoch (after a coordinator SIGKILL, or an
// elastic re-formation) ends bit for bit as an uninterrupted run does, so it saw the same
// samples in the same order; ddp_spawn's children stream their own halves; a dry run shows the
// first streamed batch.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <archive.h>
#include <archive_entry.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/bearer_token.h"
#include "tests/checkpoint_comparison.h"
#include "tests/jobs_e2e_fixture.h"

namespace dtrain::testing {
namespace shards_e2e_test {

using ::testing::HasSubstr;
using ::testing::Not;

// numpy's .npy of a float32 [1, 28, 28] array, as numpy.save writes it (format 1.0).
std::string Npy(const std::vector<float>& x) {
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 28, 28), }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string out = "\x93NUMPY";
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>(header.size() >> 8);
  out += header;
  out.append(reinterpret_cast<const char*>(x.data()), x.size() * sizeof(float));
  return out;
}

void Add(struct archive* a, const std::string& name, const std::string& bytes) {
  struct archive_entry* e = archive_entry_new();
  archive_entry_set_pathname(e, name.c_str());
  archive_entry_set_filetype(e, AE_IFREG);
  archive_entry_set_perm(e, 0644);
  archive_entry_set_size(e, static_cast<int64_t>(bytes.size()));
  archive_write_header(a, e);
  archive_write_data(a, bytes.data(), bytes.size());
  archive_entry_free(e);
}

// `shards` shards of `per_shard` learnable samples (class c brightens rows 2c..2c+2, as the
// synthetic dataset does): <key>.npy and <key>.cls. `corrupt`: that sample's .npy is garbage.
void WriteShards(const std::string& dir, const std::string& prefix, int shards, int per_shard,
                 uint32_t seed, const std::string& corrupt = "") {
  std::filesystem::create_directories(dir);
  std::mt19937 rng(seed);
  std::normal_distribution<float> noise(0.0f, 0.3f);
  for (int s = 0; s < shards; ++s) {
    struct archive* a = archive_write_new();
    archive_write_set_format_pax_restricted(a);
    const std::string path = absl::StrCat(dir, "/", prefix, "-", s, ".tar");
    ASSERT_EQ(archive_write_open_filename(a, path.c_str()), ARCHIVE_OK);
    for (int i = 0; i < per_shard; ++i) {
      const std::string key = absl::StrCat(prefix, "_", s, "_", i);
      const int label = static_cast<int>(rng() % 10);
      std::vector<float> x(28 * 28);
      for (float& v : x) v = noise(rng);
      for (int r = 2 * label; r < 2 * label + 3; ++r) {
        for (int c = 0; c < 28; ++c) x[r * 28 + c] += 1.0f;
      }
      Add(a, key + ".cls", std::to_string(label));
      Add(a, key + ".npy", key == corrupt ? std::string("not an array") : Npy(x));
    }
    archive_write_close(a);
    archive_write_free(a);
  }
}

// `shards` shards of `per_shard` samples whose .cls is the sample's index in the split
// (0, 1, 2, ... in listed order) and whose .npy is zeros.
void WriteIndexedShards(const std::string& dir, const std::string& prefix, int shards,
                        int per_shard) {
  std::filesystem::create_directories(dir);
  int64_t index = 0;
  for (int s = 0; s < shards; ++s) {
    struct archive* a = archive_write_new();
    archive_write_set_format_pax_restricted(a);
    const std::string path = absl::StrCat(dir, "/", prefix, "-", s, ".tar");
    ASSERT_EQ(archive_write_open_filename(a, path.c_str()), ARCHIVE_OK);
    for (int i = 0; i < per_shard; ++i, ++index) {
      const std::string key = absl::StrCat("sample", index);
      Add(a, key + ".cls", std::to_string(index));
      Add(a, key + ".npy", Npy(std::vector<float>(28 * 28, 0.0f)));
    }
    archive_write_close(a);
    archive_write_free(a);
  }
}

// A TorchScript module `name` with one parameter `w` (initialised by the Python expression
// `init`) and the methods `body` (Python, indented as in a class), saved by Debian's
// python3-torch as <dir>/<name>.pt; its path, or "" (with a test failure).
std::string ScriptModule(const std::string& dir, const std::string& name, const std::string& body,
                         const std::string& init) {
  // TorchScript reads the class's source, so the script is a file.
  const std::string script = absl::StrCat(dir, "/", name, ".py");
  const std::string model = absl::StrCat(dir, "/", name, ".pt");
  std::ofstream(script)
      << "import sys\nfrom typing import Dict, List, Tuple\nimport torch\n\nclass " << name
      << "(torch.nn.Module):\n    def __init__(self):\n"
      << "        super().__init__()\n        self.w = torch.nn.Parameter(" << init << ")\n"
      << body << "\n\ntorch.jit.save(torch.jit.script(" << name << "()), sys.argv[1])\n";
  CommandResult made = RunShell(absl::StrCat("/usr/bin/python3 ", script, " ", model));
  EXPECT_EQ(made.exit_code, 0) << made.output;
  return made.exit_code == 0 ? model : "";
}

std::string ShardsJob(const std::string& name, const std::string& train, const std::string& val,
                      const std::string& extra = "") {
  return absl::StrCat(R"(name: )", name, R"(
model: {builtin: mlp}
data:
  shards:
    train: ")",
                      train, R"("
    val: ")",
                      val, R"("
    fields: [{name: npy}, {name: cls, type: int}]
    shuffle_buffer: 64
)",
                      extra, R"(  batch_size: 32
  num_workers: 2
trainer:
  max_epochs: 2
  strategy: ddp
  num_nodes: 2
seed_everything: 5
optimizer: {name: sgd, lr: 0.1, momentum: 0.9}
)");
}

TEST_F(JobsE2eTest, WorkerShards_TwoRanksTrainFromTheirOwnShards) {
  const std::string data = dir() + "/shards";
  WriteShards(data, "train", 8, 100, 1);  // 800 samples: 400 per rank per epoch
  WriteShards(data, "val", 2, 50, 2);
  const std::string job =
      WriteJob("streamed", ShardsJob("streamed", "worker:" + data + "/train-{0..7}.tar",
                                     "worker:" + data + "/val-{0..1}.tar"));
  CommandResult submitted = Dtrain(absl::StrCat("fit --wait --config ", job));
  ASSERT_EQ(submitted.exit_code, 0) << submitted.output;
  EXPECT_THAT(submitted.output, HasSubstr("streamed-1 SUCCEEDED"));
  CommandResult logs = Dtrain("logs streamed-1");
  EXPECT_THAT(logs.output, HasSubstr("800 training samples, 13 batches per rank per epoch"));
  CommandResult results = Dtrain("results streamed-1 --output json");
  const google::protobuf::Struct json = ParseJson(results.output);
  const auto& metrics = json.fields().at("metrics").struct_value().fields();
  // Learnable data: a model that saw every rank's samples in order classifies the held-out set.
  EXPECT_GT(metrics.at("val_acc").number_value(), 0.9) << results.output;
  // The same job again gives the same result: shard order, shuffle buffer and splits depend
  // only on the seed.
  const std::string again =
      WriteJob("streamed2", ShardsJob("streamed2", "worker:" + data + "/train-{0..7}.tar",
                                      "worker:" + data + "/val-{0..1}.tar"));
  ASSERT_EQ(Dtrain(absl::StrCat("fit --wait --config ", again)).exit_code, 0);
  const google::protobuf::Struct json2 =
      ParseJson(Dtrain("results streamed2-1 --output json").output);
  EXPECT_EQ(json2.fields().at("metrics").struct_value().fields().at("val_loss").number_value(),
            metrics.at("val_loss").number_value());
}

// A shard list from a server that takes the request and never answers holds each worker's Setup
// in its download (the stall timeout alone is 30 s, the list's bound 2 min): cancelling the job
// ends those downloads, and the freed workers run the next job at once.
TEST_F(JobsE2eTest, ShardListNeverAnswered_CancelFreesTheWorkersAtOnce) {
  // Listens and accepts, and never answers.
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(listen(listener, 8), 0);
  ASSERT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length), 0);
  const std::string list =
      absl::StrCat("http://127.0.0.1:", ntohs(address.sin_port), "/shards/list.txt");
  CommandResult first = Dtrain("fit --output json --config " +
                               WriteJob("stuck-list", ShardsJob("stuck-list", list, list)));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const std::string id = ParseJson(first.output).fields().at("id").string_value();
  // Both workers' Setups are in the download once both connections are here.
  std::vector<int> held;
  const absl::Time until = absl::Now() + absl::Seconds(30);
  while (held.size() < 2 && absl::Now() < until) {
    pollfd ready{listener, POLLIN, 0};
    if (poll(&ready, 1, 100) == 1) held.push_back(accept(listener, nullptr, nullptr));
  }
  ASSERT_EQ(held.size(), 2u) << GetJob(id).DebugString();

  CommandResult cancelled = Dtrain("cancel " + id);
  const absl::Time start = absl::Now();
  ASSERT_EQ(cancelled.exit_code, 0) << cancelled.output;
  CommandResult next =
      Dtrain("fit --wait --config " + WriteJob("after-list", SyntheticJob("after-list", 1)));
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(next.exit_code, 0) << next.output;
  EXPECT_EQ(GetJob(id).state(), v1::CANCELLED) << GetJob(id).reason();
  // The downloads would have held the workers for the 30 s stall timeout.
  EXPECT_LT(took, absl::Seconds(20));
  std::printf("cancelled during the list's download: the next job done %.1f s later\n",
              absl::ToDoubleSeconds(took));
  for (int fd : held) close(fd);
  close(listener);
}

TEST_F(JobsE2eTest, ClientShards_UploadedOnceAndFetchedByTheWorkers) {
  const std::string data = dir() + "/mine";
  WriteShards(data + "/train", "train", 4, 64, 3);
  WriteShards(data + "/val", "val", 1, 64, 4);
  // A directory and a pattern of the client's own: not on the workers' disk as such.
  const std::string job =
      WriteJob("mine", ShardsJob("mine", data + "/train", data + "/val/val-{0..0}.tar"));
  CommandResult first = Dtrain(absl::StrCat("fit --wait --config ", job));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_THAT(first.output, HasSubstr("data.shards.train: 4 shards, 256 samples"));
  EXPECT_THAT(first.output, HasSubstr(", 4 sent, the list as artifact:sha256:"));
  EXPECT_THAT(first.output, HasSubstr("mine-1 SUCCEEDED"));
  CommandResult second = Dtrain(absl::StrCat("fit --wait --config ", job));
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_THAT(second.output, HasSubstr("data.shards.train: 4 shards, 256 samples"));
  EXPECT_THAT(second.output, HasSubstr(", 0 sent, the list as artifact:sha256:"));
}

// The client's shards on a cluster with tokens: each worker runs its rank in a child process
// that holds only the job's token (rank isolation), and fetches the shards the uploaded list
// names one by one with it: the coordinator lets a job's token read the shards its lists name.
class TokenedShardsE2eTest : public ::testing::Test {
 protected:
  void TearDown() override { SetClientToken(""); }
};

TEST_F(TokenedShardsE2eTest, ClientShards_IsolatedRanksFetchThemWithTheJobsToken) {
  LocalCluster cluster(absl::StrCat(::testing::TempDir(), "/tokened-shards-", getpid()));
  const std::string admin = "shards-admin-token-0123456789";
  const std::string token_flag = "--token_file=" + cluster.dir() + "/token";
  std::ofstream(cluster.dir() + "/token") << admin << "\n";
  SetClientToken(admin);  // the cluster's own stubs
  ASSERT_TRUE(cluster.StartCoordinator("127.0.0.1:0", {token_flag}));
  ASSERT_TRUE(cluster.AddWorker("w0", {token_flag}));
  ASSERT_TRUE(cluster.AddWorker("w1", {token_flag}));
  ASSERT_TRUE(WaitFor([&] { return cluster.AliveWorkers(true) == 2; }, absl::Seconds(10)));
  const std::string data = cluster.dir() + "/mine";
  WriteShards(data + "/train", "train", 4, 64, 3);
  WriteShards(data + "/val", "val", 1, 64, 4);
  const std::string job =
      cluster.WriteSpec("mine", ShardsJob("mine", data + "/train", data + "/val/val-{0..0}.tar"));
  CommandResult fit =
      cluster.Dtrain(absl::StrCat("fit --wait --config ", job), "DTRAIN_TOKEN=" + admin);
  EXPECT_EQ(fit.exit_code, 0) << fit.output;
  EXPECT_THAT(fit.output, HasSubstr(", 4 sent, the list as artifact:sha256:"));
  EXPECT_THAT(fit.output, HasSubstr("mine-1 SUCCEEDED"));
  EXPECT_TRUE(cluster.Shutdown());
}

TEST_F(JobsE2eTest, BadSample_NamedWithShardKeyAndRank_OrSkippedAndCounted) {
  const std::string data = dir() + "/bad";
  WriteShards(data, "train", 4, 64, 5, /*corrupt=*/"train_2_7");
  WriteShards(data, "val", 1, 32, 6);
  const std::string train = "worker:" + data + "/train-{0..3}.tar";
  const std::string val = "worker:" + data + "/val-0.tar";
  const std::string failing = WriteJob("bad", ShardsJob("bad", train, val));
  CommandResult failed = Dtrain(absl::StrCat("fit --wait --config ", failing));
  EXPECT_NE(failed.exit_code, 0) << failed.output;
  const v1::JobStatus status = GetJob("bad-1");
  EXPECT_EQ(status.state(), v1::FAILED);
  EXPECT_THAT(status.reason(), HasSubstr("train-2.tar', sample 'train_2_7': field npy: "));
  EXPECT_THAT(status.reason(), HasSubstr("rank "));
  // The workers survive it and run the next job.
  ASSERT_TRUE(WaitFor([&] { return IdleWorkers() == 2; }, absl::Seconds(10)));
  const std::string skipping =
      WriteJob("skip", ShardsJob("skip", train, val, "    on_error: skip\n"));
  CommandResult skipped = Dtrain(absl::StrCat("fit --wait --config ", skipping));
  ASSERT_EQ(skipped.exit_code, 0) << skipped.output;
  CommandResult logs = Dtrain("logs skip-1");
  EXPECT_THAT(logs.output, HasSubstr("skipped 2 samples (data.shards.on_error: skip)"))
      << "one bad sample, read in each of 2 epochs";
}

// A TorchScript model whose predict_step returns each sample's .cls (its own index), so that
// predictions.csv says which sample each row holds; saved in `dir`.
std::string EchoModel(const std::string& dir) {
  return ScriptModule(dir, "Echo", R"(
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(1).sum(1) * self.w

    @torch.jit.export
    def training_step(self, batch: Tuple[torch.Tensor, torch.Tensor], batch_idx: int):
        return self.forward(batch[0]).mean()

    @torch.jit.export
    def predict_step(self, batch: Tuple[torch.Tensor, torch.Tensor],
                     batch_idx: int) -> Dict[str, torch.Tensor]:
        return {"sample": batch[1]})",
                      "torch.zeros(1)");
}

// A list file naming `shards` shards <prefix>-<i>.tar of `per_shard` samples each in `dir`.
std::string WriteList(const std::string& dir, const std::string& prefix, int shards,
                      int per_shard) {
  const std::string list = absl::StrCat(dir, "/", prefix, ".txt");
  std::ofstream out(list);
  for (int s = 0; s < shards; ++s) {
    out << dir << "/" << prefix << "-" << s << ".tar samples:" << per_shard << "\n";
  }
  return list;
}

// on_error: skip with a shard that cannot be read (gone after the list was written). Training:
// its samples give up their positions, the rank's epoch is padded from its start, and the job
// trains to the end with whole batches, counting the samples it could not read. Predict: every
// readable sample gets its own row, and the unreadable ones none.
TEST_F(JobsE2eTest, UnreadableShard_Skip_TrainsWholeBatches_PredictsTheRestInPlace) {
  const std::string data = dir() + "/gone";
  WriteShards(data, "train", 4, 64, 5);
  WriteShards(data, "val", 1, 32, 6);
  const std::string train = "worker:" + WriteList(data, "train", 4, 64);
  std::filesystem::remove(data + "/train-2.tar");
  const std::string fit = WriteJob(
      "gone", ShardsJob("gone", train, "worker:" + data + "/val-0.tar", "    on_error: skip\n"));
  CommandResult trained = Dtrain(absl::StrCat("fit --wait --config ", fit));
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  const v1::JobStatus status = GetJob("gone-1");
  EXPECT_EQ(status.state(), v1::SUCCEEDED);
  // 256 samples, 2 ranks x batch 32: 4 whole steps per epoch, 2 epochs.
  EXPECT_EQ(status.progress().global_step(), 8);
  CommandResult logs = Dtrain("logs gone-1");
  EXPECT_THAT(logs.output, HasSubstr("skipped 128 samples (data.shards.on_error: skip)"))
      << "the 64 samples of train-2.tar, in each of 2 epochs";

  const std::string keys = dir() + "/keys";
  WriteIndexedShards(keys, "keys", 3, 25);
  const std::string list = WriteList(keys, "keys", 3, 25);
  std::filesystem::remove(keys + "/keys-1.tar");  // samples 25..49
  const std::string model = EchoModel(keys);
  ASSERT_FALSE(model.empty());
  const std::string job =
      WriteJob("echo", absl::StrCat("name: echo\nmodel: {torchscript: \"worker:", model, R"("}
data:
  shards:
    predict: "worker:)",
                                    list, R"("
    fields: [{name: npy}, {name: cls, type: int}]
    on_error: skip
  batch_size: 8
trainer: {strategy: ddp, num_nodes: 2, batches_per_call: 2}
)"));
  CommandResult predicted = Dtrain("predict --wait --config " + job);
  ASSERT_EQ(predicted.exit_code, 0) << predicted.output;
  std::ifstream csv(GetJob("echo-1").predictions());
  std::string header;
  std::getline(csv, header);
  EXPECT_EQ(header, "index,sample");
  std::vector<std::string> rows;
  for (std::string line; std::getline(csv, line);) rows.push_back(line);
  std::vector<std::string> expected;
  for (int i = 0; i < 75; ++i) {
    if (i < 25 || i >= 50) expected.push_back(absl::StrCat(i, ",", i));
  }
  EXPECT_EQ(rows, expected);
}

// Sample keys collected directly: a predict run over a streamed split whose samples carry their
// own index (as .cls), through a TorchScript model that returns it, on 2 ranks, in batches of 8
// that split neither the shards (25 samples) nor the ranks' halves (38 and 37) evenly, 2
// batches per call: predictions.csv's row i holds sample i, so every sample came exactly once.
TEST_F(JobsE2eTest, PredictShards_RowIHoldsSampleI_EverySampleOnce) {
  const std::string data = dir() + "/keys";
  WriteIndexedShards(data, "keys", 3, 25);
  const std::string model = EchoModel(data);
  ASSERT_FALSE(model.empty());
  const std::string job =
      WriteJob("keys", absl::StrCat("name: keys\nmodel: {torchscript: \"worker:", model, R"("}
data:
  shards:
    predict: "worker:)",
                                    data, R"(/keys-{0..2}.tar"
    fields: [{name: npy}, {name: cls, type: int}]
  batch_size: 8
trainer: {strategy: ddp, num_nodes: 2, batches_per_call: 2}
)"));
  CommandResult predicted = Dtrain("predict --wait --config " + job);
  ASSERT_EQ(predicted.exit_code, 0) << predicted.output;
  std::ifstream csv(GetJob("keys-1").predictions());
  std::string header;
  std::getline(csv, header);
  EXPECT_EQ(header, "index,sample");
  int rows = 0;
  for (std::string line; std::getline(csv, line); ++rows) {
    EXPECT_EQ(line, absl::StrCat(rows, ",", rows)) << "row " << rows << " holds another sample";
  }
  EXPECT_EQ(rows, 75);
}

// The resume tests' job: 16 shards of 256 samples on the workers' disk, 64 steps per epoch on 2
// ranks, 3 epochs, and a checkpoint every 20 steps and at the end; no validation, so no
// checkpoint falls on an epoch's end before the last step (lcm(20, 64) = 320 > 192): a job
// resumed from any of them resumes mid-epoch.
constexpr int64_t kResumeSteps = 3 * 64;
std::string ResumableJob(const std::string& name, const std::string& data,
                         const std::string& trainer_extra = "") {
  return absl::StrCat("name: ", name, R"(
model: {builtin: mlp}
data:
  shards:
    train: "worker:)",
                      data, R"(/train-{0..15}.tar"
    fields: [{name: npy}, {name: cls, type: int}]
    shuffle_buffer: 64
  batch_size: 32
  num_workers: 2
trainer: {max_epochs: 3, strategy: ddp, num_nodes: 2, batches_per_call: 8)",
                      trainer_extra, R"(}
seed_everything: 5
optimizer: {name: sgd, lr: 0.05, momentum: 0.9}
checkpoint: {every_n_steps: 20}
)");
}

// Waits until `id` has written a checkpoint while still running.
void WaitForACheckpoint(LocalCluster& cluster, const std::string& id) {
  ASSERT_TRUE(WaitFor(
      [&] {
        const v1::JobStatus s = cluster.GetJob(id);
        return !s.checkpoint().empty() || IsTerminal(s.state());
      },
      absl::Seconds(120)));
  ASSERT_EQ(cluster.GetJob(id).state(), v1::RUNNING) << "the job ended before the fault";
}

// From the job's log line "resumed from <checkpoint> at step S (epoch E, batch B)": B, the
// batch of the epoch the stream resumed at (-1 when there is no such line).
int64_t ResumedAtBatch(const std::string& log) {
  const size_t at = log.find("resumed from ");
  if (at == std::string::npos) return -1;
  const size_t batch = log.find(", batch ", at);
  if (batch == std::string::npos) return -1;
  return std::stoll(log.substr(batch + 8));
}

v1::JobStatus WaitForEnd(LocalCluster& cluster, const std::string& id) {
  EXPECT_TRUE(WaitFor([&] { return IsTerminal(cluster.GetJob(id).state()); }, absl::Seconds(180)));
  return cluster.GetJob(id);
}

// The coordinator SIGKILLed mid-epoch and restarted: the workers' streams restart at the
// checkpoint's position (by replaying the epoch's plan up to it), and the job ends bit for bit
// as the same job run without the crash: the same samples in the same order, none seen twice
// and none skipped (one sample more or less in any step changes the weights).
TEST_F(JobsE2eTest, CoordinatorSigkillMidEpoch_StreamResumesExactly_EndsAsUninterrupted) {
  const std::string data = dir() + "/resume";
  WriteShards(data, "train", 16, 256, 7);
  const std::string reference =
      RunToTheEnd(*cluster_, "reference", ResumableJob("reference", data));
  ASSERT_FALSE(reference.empty());
  const std::string id = cluster_->Submit("crashed", ResumableJob("crashed", data));
  WaitForACheckpoint(*cluster_, id);
  const int64_t step_at_crash = cluster_->GetJob(id).progress().global_step();
  cluster_->StopCoordinator(SIGKILL);
  ASSERT_TRUE(cluster_->StartCoordinator(cluster_->address()));
  const v1::JobStatus done = WaitForEnd(*cluster_, id);
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.reason();
  EXPECT_EQ(done.progress().global_step(), kResumeSteps);
  const std::string log = Dtrain("logs " + id).output;
  EXPECT_THAT(log, HasSubstr("the coordinator restarted while this job ran"));
  const int64_t batch = ResumedAtBatch(log);
  EXPECT_GT(batch, 0) << "not resumed mid-epoch:\n" << log;
  EXPECT_TRUE(SameFinalState(*cluster_, id, reference));
  std::printf("crashed at step %lld; resumed at batch %lld of its epoch\n",
              static_cast<long long>(step_at_crash), static_cast<long long>(batch));
}

// Training sample keys collected directly, across a coordinator SIGKILL mid-epoch: a TorchScript
// model whose loss is the sum of its parameter w at the batch's sample indices (the samples'
// .cls), under plain SGD at lr 2 on 2 ranks (gradients averaged), so each w[i] ends as minus
// the number of times sample i was trained on. After 3 epochs, with the crash and the resume in
// the first, each of the 2048 samples was trained on exactly 3 times: no repeats, no skips.
TEST_F(JobsE2eTest, CoordinatorSigkillMidEpoch_EverySampleTrainedOncePerEpoch) {
  const std::string data = dir() + "/tally";
  WriteIndexedShards(data, "train", 16, 128);
  const std::string model = ScriptModule(data, "Tally", R"(
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    @torch.jit.export
    def training_step(self, batch: Tuple[torch.Tensor, torch.Tensor], batch_idx: int):
        return self.w.index_select(0, batch[1]).sum())",
                                         "torch.zeros(2048)");
  ASSERT_FALSE(model.empty());
  // One batch per call and a checkpoint every 10 steps (never at an epoch's end but the last):
  // the crash comes mid-epoch, well before the 96th step.
  const std::string id =
      cluster_->Submit("tally", absl::StrCat("name: tally\nmodel: {torchscript: \"worker:", model,
                                             R"("}
data:
  shards:
    train: "worker:)",
                                             data, R"(/train-{0..15}.tar"
    fields: [{name: npy}, {name: cls, type: int}]
    shuffle_buffer: 64
  batch_size: 32
trainer: {max_epochs: 3, strategy: ddp, num_nodes: 2, batches_per_call: 1}
seed_everything: 5
optimizer: {name: sgd, lr: 2.0}
checkpoint: {every_n_steps: 10}
)"));
  ASSERT_FALSE(id.empty());
  WaitForACheckpoint(*cluster_, id);
  cluster_->StopCoordinator(SIGKILL);
  ASSERT_TRUE(cluster_->StartCoordinator(cluster_->address()));
  const v1::JobStatus done = WaitForEnd(*cluster_, id);
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.reason();
  EXPECT_EQ(done.progress().global_step(), 96);
  const std::string log = Dtrain("logs " + id).output;
  EXPECT_THAT(log, HasSubstr("the coordinator restarted while this job ran"));
  const int64_t batch = ResumedAtBatch(log);
  EXPECT_GT(batch, 0) << "not resumed mid-epoch:\n" << log;
  const std::string checkpoint = DownloadCheckpoint(*cluster_, id);
  ASSERT_FALSE(checkpoint.empty());
  std::ofstream(data + "/tally.py") << R"(import sys
import torch
w = torch.load(sys.argv[1], map_location="cpu")["state_dict"]["w"]
values, counts = torch.unique(w, return_counts=True)
print(" ".join(f"{v:g}x{n}" for v, n in zip(values.tolist(), counts.tolist())))
)";
  CommandResult tally = RunShell(absl::StrCat("/usr/bin/python3 ", data, "/tally.py ", checkpoint));
  ASSERT_EQ(tally.exit_code, 0) << tally.output;
  EXPECT_EQ(tally.output, "-3x2048\n") << "(times trained on) x (samples)";
  std::printf("resumed at batch %lld of epoch 0; w: %s", static_cast<long long>(batch),
              tally.output.c_str());
}

// An elastic job loses a worker mid-epoch and re-forms with an idle one: the world is the same,
// so each rank's plan is too, and the job ends bit for bit as an uninterrupted run.
TEST_F(JobsE2eTest, ElasticReformationSameWorld_StreamResumesExactly_EndsAsUninterrupted) {
  ASSERT_TRUE(cluster_->AddWorker("w2"));
  ASSERT_TRUE(WaitFor([&] { return IdleWorkers() == 3; }, absl::Seconds(10)));
  const std::string data = dir() + "/elastic";
  WriteShards(data, "train", 16, 256, 8);
  const std::string reference =
      RunToTheEnd(*cluster_, "reference", ResumableJob("reference", data));
  ASSERT_FALSE(reference.empty());
  const std::string id =
      cluster_->Submit("elastic", ResumableJob("elastic", data, ", min_nodes: 1"));
  WaitForACheckpoint(*cluster_, id);
  const v1::JobStatus before = cluster_->GetJob(id);
  ASSERT_EQ(before.workers_size(), 2);
  cluster_->worker(before.workers(1)).process().Kill(SIGKILL);
  const v1::JobStatus done = WaitForEnd(*cluster_, id);
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.reason();
  EXPECT_EQ(done.workers_size(), 2) << "re-formed with the idle worker";
  EXPECT_EQ(done.progress().global_step(), kResumeSteps);
  const std::string log = Dtrain("logs " + id).output;
  EXPECT_THAT(log, HasSubstr("re-forming on"));
  EXPECT_GT(ResumedAtBatch(log), 0) << "not resumed mid-epoch:\n" << log;
  EXPECT_TRUE(SameFinalState(*cluster_, id, reference));
}

// An elastic job loses a worker and goes on alone: the step carries over into the one-rank
// world's 128-step epochs, and the rank streams its one-rank plan from there, exactly as a
// one-worker job started from the same checkpoint by ckpt_path does (docs/data.md, "Resuming a
// streamed job"): the same final state, bit for bit.
TEST_F(JobsE2eTest, ElasticReformationSmallerWorld_StreamsTheNewPlan_AsCkptPathThere) {
  const std::string data = dir() + "/shrink";
  WriteShards(data, "train", 16, 256, 14);
  WriteShards(data, "val", 1, 64, 15);
  // Validation (and a kept checkpoint) twice an epoch: at most 6 in all, so the one the job
  // resumes from is still there at the end.
  const auto job = [&](const std::string& name, int nodes, const std::string& extra) {
    return absl::StrReplaceAll(
        ResumableJob(name, data, ", val_check_interval: 0.5, max_epochs: 2" + extra),
        {{"max_epochs: 3, ", ""},
         {"num_nodes: 2", absl::StrCat("num_nodes: ", nodes)},
         {"    fields:", absl::StrCat("    val: \"worker:", data, "/val-0.tar\"\n    fields:")},
         {"checkpoint: {every_n_steps: 20}",
          "checkpoint: {every_n_steps: 0, monitor: val_loss, save_top_k: 8}"}});
  };
  const std::string id = cluster_->Submit("shrink", job("shrink", 2, ", min_nodes: 1"));
  WaitForACheckpoint(*cluster_, id);
  const v1::JobStatus before = cluster_->GetJob(id);
  ASSERT_EQ(before.workers_size(), 2);
  cluster_->worker(before.workers(1)).process().Kill(SIGKILL);
  const v1::JobStatus done = WaitForEnd(*cluster_, id);
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.reason();
  ASSERT_EQ(done.workers_size(), 1);
  EXPECT_EQ(done.progress().global_step(), 2 * 128) << "max_epochs of the one-rank world";
  const std::string log = Dtrain("logs " + id).output;
  const std::string prefix = absl::StrCat("resumed from job:", id, "/");
  const size_t at = log.find(prefix);
  ASSERT_NE(at, std::string::npos) << log;
  const size_t name_at = at + prefix.size();
  const std::string checkpoint = log.substr(name_at, log.find(' ', name_at) - name_at);
  const int64_t step = std::stoll(checkpoint.substr(checkpoint.find("-step=") + 6));
  EXPECT_THAT(log, HasSubstr(absl::StrCat(prefix, checkpoint, " at step ", step, " (epoch ",
                                          step / 128, ", batch ", step % 128, ")")));
  const std::string alone =
      RunToTheEnd(*cluster_, "alone",
                  absl::StrCat(job("alone", 1, ""), "ckpt_path: job:", id, "/", checkpoint, "\n"));
  ASSERT_FALSE(alone.empty());
  EXPECT_TRUE(SameFinalState(*cluster_, id, alone));
  std::printf("resumed from %s on the survivor at epoch %lld, batch %lld of 128\n",
              checkpoint.c_str(), static_cast<long long>(step / 128),
              static_cast<long long>(step % 128));
}

// ddp_spawn: two children of one worker are ranks 0 and 1, each streaming its own half through
// its own artifact cache. Same world, same plans: the job ends bit for bit as the same job on
// two workers. The client's uploaded shards stream in the children too.
TEST_F(JobsE2eTest, DdpSpawn_ChildrenStreamTheirHalves_AsTwoWorkersDo) {
  const std::string data = dir() + "/spawn";
  WriteShards(data, "train", 8, 100, 9);
  WriteShards(data, "val", 2, 50, 10);
  const std::string train = "worker:" + data + "/train-{0..7}.tar";
  const std::string val = "worker:" + data + "/val-{0..1}.tar";
  const std::string spawn_trainer = "  strategy: ddp_spawn\n  devices: 2\n  num_nodes: 1\n";
  const std::string reference = RunToTheEnd(*cluster_, "two", ShardsJob("two", train, val));
  ASSERT_FALSE(reference.empty());
  const std::string spawned =
      RunToTheEnd(*cluster_, "spawned",
                  absl::StrReplaceAll(ShardsJob("spawned", train, val),
                                      {{"  strategy: ddp\n  num_nodes: 2\n", spawn_trainer}}));
  ASSERT_FALSE(spawned.empty());
  EXPECT_THAT(Dtrain("logs " + spawned).output,
              HasSubstr("800 training samples, 13 batches per rank per epoch"));
  EXPECT_TRUE(SameFinalState(*cluster_, spawned, reference));

  WriteShards(data + "/mine", "train", 4, 64, 11);
  const std::string uploaded =
      RunToTheEnd(*cluster_, "uploaded",
                  absl::StrReplaceAll(ShardsJob("uploaded", data + "/mine", val),
                                      {{"  strategy: ddp\n  num_nodes: 2\n", spawn_trainer}}));
  ASSERT_FALSE(uploaded.empty());
  EXPECT_THAT(Dtrain("logs " + uploaded).output,
              HasSubstr("256 training samples, 4 batches per rank per epoch"));
}

// fit --dry-run from shards: an idle worker streams the first batch, from its own disk or from
// the client's uploads, and reports its structure; nothing is queued.
TEST_F(JobsE2eTest, DryRun_Shards_ShowsTheFirstStreamedBatch) {
  const std::string data = dir() + "/dry";
  WriteShards(data, "train", 2, 40, 12);
  WriteShards(data, "val", 1, 20, 13);
  for (const auto& [train, val] : std::vector<std::pair<std::string, std::string>>{
           {"worker:" + data + "/train-{0..1}.tar", "worker:" + data + "/val-0.tar"},
           {data + "/train-{0..1}.tar", data + "/val-0.tar"}}) {
    CommandResult dry =
        Dtrain("fit --dry-run --config " + WriteJob("dry", ShardsJob("dry", train, val)));
    ASSERT_EQ(dry.exit_code, 0) << dry.output;
    EXPECT_THAT(dry.output, HasSubstr("dry run on worker 'w"));
    EXPECT_THAT(dry.output, HasSubstr("batch           tuple(float32[32, 1, 28, 28], int64[32])"));
    EXPECT_THAT(dry.output, HasSubstr("training_step   returns loss; loss "));
    EXPECT_THAT(dry.output, HasSubstr("validation_step returns acc, loss"));
    EXPECT_THAT(dry.output, HasSubstr("split train    80 samples"));
    EXPECT_THAT(dry.output, HasSubstr("split val      20 samples"));
  }
  EXPECT_THAT(Dtrain("list --output json").output, Not(HasSubstr("\"id\"")))
      << "a dry run queues nothing";
}

}  // namespace shards_e2e_test
}  // namespace dtrain::testing

namespace dtrain::testing {
namespace shards_e2e_test {

// data.transforms.script: a user's TorchScript transform runs on the decoding threads, in
// training mode for the training split only. Here it teaches the model that every sample is a 3;
// validation, untransformed, then shows it (a model that saw the true labels scores > 0.9).
TEST_F(JobsE2eTest, ScriptTransform_RunsInTrainingModeOnTheTrainSplitOnly) {
  const std::string data = dir() + "/script";
  WriteShards(data, "train", 4, 100, 7);
  WriteShards(data, "val", 1, 100, 8);
  const std::string transform = ScriptModule(data, "AllThrees", R"(
    def forward(self, fields: List[torch.Tensor], seed: int) -> List[torch.Tensor]:
        if self.training:
            return [fields[0], torch.full_like(fields[1], 3)]
        return fields)",
                                             "torch.zeros(1)");
  ASSERT_FALSE(transform.empty());
  const std::string job = WriteJob(
      "threes",
      ShardsJob("threes", "worker:" + data + "/train-{0..3}.tar", "worker:" + data + "/val-0.tar",
                absl::StrCat("  transforms: {script: \"worker:", transform, "\"}\n")));
  CommandResult submitted = Dtrain(absl::StrCat("fit --wait --config ", job));
  ASSERT_EQ(submitted.exit_code, 0) << submitted.output;
  const google::protobuf::Struct json = ParseJson(Dtrain("results threes-1 --output json").output);
  const double val_acc =
      json.fields().at("metrics").struct_value().fields().at("val_acc").number_value();
  EXPECT_LT(val_acc, 0.5) << "the training labels were not all replaced by 3";
  EXPECT_GT(val_acc, 0.0) << "the validation labels were replaced too";
}

}  // namespace shards_e2e_test
}  // namespace dtrain::testing
