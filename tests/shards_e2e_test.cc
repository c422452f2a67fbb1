// Streamed shards end to end (issue 36): a real local cluster (a coordinator and two workers on
// 127.0.0.1) trains from WebDataset tar shards, driven by the dtrain command line: shards on the
// workers' disk ("worker:"), the client's own shards uploaded one by one, and bad data named by
// shard, sample and rank, or skipped and counted, with the workers left free for the next job.
#include <archive.h>
#include <archive_entry.h>

#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "tests/jobs_e2e_fixture.h"

namespace dtrain::testing {
namespace {

using ::testing::HasSubstr;

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

}  // namespace
}  // namespace dtrain::testing
