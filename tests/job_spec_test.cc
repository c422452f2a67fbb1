// The pieces of jobs that need no cluster: the spec file reader and its rules, the distributed
// sampler, TensorBoard's record framing and the SVG plot.
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <gmock/gmock.h>
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include "client/job_spec_file.h"
#include "client/metrics_plot.h"
#include "client/progress_view.h"
#include "common/distributed_sampler.h"
#include "common/job_spec.h"
#include "common/tfevents_writer.h"
#include "dtrain/v1/tfevents.pb.h"
#include "tests/test_support.h"

namespace dtrain {
namespace job_spec_test {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kIssueExample[] = R"(
name: fashion-cnn
model: {builtin: cnn}                 # or {torchscript: path/to/model.pt}
data: {builtin: fashion-mnist, batch_size: 64}
trainer:
  max_epochs: 2
  strategy: ddp
  precision: 32-true
  accelerator: cpu
  devices: 1
  num_nodes: 2
seed_everything: 1
optimizer: {name: sgd, lr: 0.05, momentum: 0.9}
lr_scheduler: {name: cosine}
checkpoint: {every_n_steps: 500, monitor: val_acc, save_top_k: 1}
)";

TEST(JobSpecFile, TheIssueExample_ParsesIntoTheMessage) {
  auto spec = ParseJobSpec(kIssueExample);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name(), "fashion-cnn");
  EXPECT_EQ(spec->model().builtin(), "cnn");
  EXPECT_EQ(spec->data().builtin(), "fashion-mnist");
  EXPECT_EQ(spec->data().batch_size(), 64);
  EXPECT_EQ(spec->trainer().max_epochs(), 2);
  EXPECT_EQ(spec->trainer().num_nodes(), 2);
  EXPECT_EQ(spec->trainer().precision(), "32-true");
  EXPECT_DOUBLE_EQ(spec->optimizer().lr(), 0.05);
  EXPECT_DOUBLE_EQ(spec->optimizer().momentum(), 0.9);
  EXPECT_EQ(spec->lr_scheduler().name(), "cosine");
  EXPECT_EQ(spec->checkpoint().every_n_steps(), 500);
  EXPECT_EQ(spec->checkpoint().monitor(), "val_acc");
  ASSERT_TRUE(NormalizeJobSpec(&*spec).ok());
  EXPECT_EQ(spec->checkpoint().mode(), "max");     // an accuracy is maximized
  EXPECT_EQ(spec->data().eval_batch_size(), 256);  // default: 4 x batch_size
  EXPECT_TRUE(spec->data().shuffle());
  EXPECT_EQ(spec->trainer().batches_per_call(), 0);  // sized by the trainer from its calls
}

TEST(JobSpecFile, JsonIsAcceptedToo) {
  auto spec = ParseJobSpec(R"({"name": "j", "model": {"builtin": "mlp"},
                               "data": {"synthetic": {"train_size": 64}},
                               "trainer": {"precision": 16, "max_steps": 5}})");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->trainer().precision(), "16");  // a YAML number, kept as the field's text
  EXPECT_EQ(spec->trainer().max_steps(), 5);
}

TEST(JobSpecFile, BadKeysAndValues_NamedByPath) {
  struct Case {
    std::string text;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"trainer: {max_epoch: 2}", "trainer.max_epoch: unknown key; trainer has max_epochs"},
      {"colour: red", "colour: unknown key; a job spec has name, model"},
      {"trainer: {max_epochs: two}", "trainer.max_epochs: expected an integer, got 'two'"},
      {"optimizer: {lr: fast}", "optimizer.lr: expected a number, got 'fast'"},
      {"data: {shuffle: maybe}", "data.shuffle: expected true or false"},
      {"model: {builtin: cnn, torchscript: m.pt}",
       "model: give only one of builtin and torchscript"},
      {"trainer: 3", "trainer: expected a mapping"},
      {"trainer: {max_epochs: [1, 2]}", "trainer.max_epochs: expected a single value"},
      {"trainer: {max_epochs:}", "trainer.max_epochs: has no value"},
      // Lightning's spellings only; the old keys name the new ones.
      {"trainer: {num_workers: 2}", "trainer.num_workers: renamed to trainer.num_nodes"},
      {"trainer: {min_workers: 1}", "trainer.min_workers: renamed to trainer.min_nodes"},
      {"resume_from: a.ckpt", "resume_from: renamed to ckpt_path"},
      {"trainer: {seed: 1}", "trainer.seed: moved to seed_everything"},
      {"trainer: {max_epochs: 2", "syntax error at line 1"},
  };
  for (const Case& c : cases) {
    auto spec = ParseJobSpec(c.text);
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_THAT(std::string(spec.status().message()), HasSubstr(c.message)) << c.text;
  }
  EXPECT_EQ(ReadJobConfig({"/nonexistent/job.yaml"}, {}).status().code(),
            absl::StatusCode::kNotFound);
}

// The workers do not share the client's working directory: relative paths in a spec file are
// resolved against the file's own directory; absolute ones and lists stay as written.
TEST(JobSpecFile, RelativePaths_ResolvedAgainstTheFilesDirectory) {
  const std::string dir =
      std::filesystem::path(testing::TestTempPath("spec-paths")).lexically_normal().string();
  std::filesystem::create_directories(dir + "/jobs");
  std::ofstream(dir + "/jobs/job.yaml") << R"(model: {torchscript: ../models/m.pt}
data: {tensors_file: data.pt, normalize: {mean: [0.5, 0.25], std: [1, 2]}}
ckpt_path: /abs/start.ckpt
checkpoint: {dirpath: ckpts}
)";
  auto spec = ReadJobConfig({dir + "/jobs/job.yaml"}, {});
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model().torchscript(), dir + "/models/m.pt");
  EXPECT_EQ(spec->data().tensors_file(), dir + "/jobs/data.pt");
  EXPECT_EQ(spec->ckpt_path(), "/abs/start.ckpt");
  EXPECT_EQ(spec->checkpoint().dirpath(), dir + "/jobs/ckpts");
  ASSERT_EQ(spec->data().normalize().mean_size(), 2);
  EXPECT_EQ(spec->data().normalize().mean(1), 0.25);
  EXPECT_EQ(spec->data().normalize().std(1), 2);
}

// LightningCLI's layering: configs in order, then dotted overrides; later wins, lists are
// replaced whole, paths resolve against the file (or, for an override, the working directory)
// that set them.
TEST(JobConfig, ConfigsThenOverrides_LaterWins_PathsFromWhereTheyWereSet) {
  const std::string dir =
      std::filesystem::path(testing::TestTempPath("config-layers")).lexically_normal().string();
  std::filesystem::create_directories(dir + "/a");
  std::filesystem::create_directories(dir + "/b");
  std::ofstream(dir + "/a/base.yaml") << R"(name: base
model: {torchscript: model.pt}
data: {tensors_file: data.pt, batch_size: 32, normalize: {mean: [0.1, 0.2], std: [1, 1]}}
trainer: {max_epochs: 3, strategy: ddp, num_nodes: 2}
seed_everything: 7
)";
  std::ofstream(dir + "/b/more.yaml") << R"(data: {tensors_file: other.pt, normalize: {mean: [0.5]}}
trainer: {max_epochs: 5}
)";
  auto spec = ReadJobConfig({dir + "/a/base.yaml", dir + "/b/more.yaml"},
                            {{"trainer.max_epochs", "9"},
                             {"data.batch_size", "128"},
                             {"optimizer.lr", "0.002"},
                             {"ckpt_path", "runs/last.ckpt"},
                             {"trainer.precision", "16-mixed"}});
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name(), "base");
  EXPECT_EQ(spec->model().torchscript(), dir + "/a/model.pt");
  EXPECT_EQ(spec->data().tensors_file(), dir + "/b/other.pt");
  ASSERT_EQ(spec->data().normalize().mean_size(), 1) << "a list is replaced, not appended to";
  EXPECT_EQ(spec->data().normalize().mean(0), 0.5);
  EXPECT_EQ(spec->data().normalize().std_size(), 2);
  EXPECT_EQ(spec->trainer().max_epochs(), 9);
  EXPECT_EQ(spec->trainer().num_nodes(), 2);
  EXPECT_EQ(spec->trainer().precision(), "16-mixed");
  EXPECT_EQ(spec->data().batch_size(), 128);
  EXPECT_DOUBLE_EQ(spec->optimizer().lr(), 0.002);
  EXPECT_EQ(spec->seed_everything(), 7u);
  EXPECT_EQ(spec->ckpt_path(),
            (std::filesystem::current_path() / "runs/last.ckpt").lexically_normal().string());

  struct Case {
    std::vector<std::pair<std::string, std::string>> overrides;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{{"trainer.max_epochs", "five"}},
       "--trainer.max_epochs: trainer.max_epochs: expected an integer, got 'five'"},
      {{{"trainer.max_epoch", "5"}},
       "--trainer.max_epoch: trainer.max_epoch: unknown key; trainer has"},
      {{{"trainer.num_workers", "2"}}, "renamed to trainer.num_nodes"},
      {{{"trainer", "5"}}, "--trainer: trainer: expected a mapping"},
      {{{"trainer..max_epochs", "5"}}, "an override is --section.key=value"},
      {{{"stage", "test"}}, "stage: 'test' is chosen by the subcommand"},
  };
  for (const Case& c : cases) {
    auto bad = ReadJobConfig({dir + "/a/base.yaml"}, c.overrides);
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(std::string(bad.status().message()), HasSubstr(c.message));
  }
  auto missing = ReadJobConfig({dir + "/nope.yaml"}, {});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr(dir + "/nope.yaml"));
}

// `normalized` as --print_config prints it, written to `file`, read back and normalized again;
// it must equal `normalized` (not in serialized bytes: a map's entries have no fixed order).
v1::JobSpec PrintedAndReadBack(const v1::JobSpec& normalized, const std::string& file) {
  const std::string yaml = JobSpecToYaml(normalized);
  const std::string path = testing::TestTempPath(file);
  std::ofstream(path) << yaml;
  auto back = ReadJobConfig({path}, {});
  EXPECT_TRUE(back.ok()) << back.status() << "\n" << yaml;
  if (!back.ok()) return v1::JobSpec();
  v1::JobSpec again = *back;
  EXPECT_EQ(NormalizeJobSpec(&again), absl::OkStatus());
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(again, normalized)) << yaml;
  return again;
}

// --print_config prints a config that reads back to the same normalized spec.
TEST(JobConfig, PrintedConfig_ReadsBackToTheSameSpec) {
  auto spec = ParseJobSpec(R"(name: round
model: {builtin: cnn}
data: {tensors_file: /d/data.pt, batch_size: 64, shuffle: false,
       normalize: {key: x, mean: [0.2860, 1.0e-05], std: [0.353, 2]}}
trainer: {max_epochs: 2, precision: 16-mixed, gradient_clip_val: 0.5, num_nodes: 2}
optimizer: {name: adamw, lr: 0.001, eps: 1.0e-08}
lr_scheduler: {name: cosine}
checkpoint: {monitor: val_acc, storage_options: {fsync: "true", region: eu}}
early_stopping: {monitor: val_loss, min_delta: 0.001}
seed_everything: 42
ckpt_path: /c/last.ckpt
)");
  ASSERT_TRUE(spec.ok()) << spec.status();
  v1::JobSpec normalized = *spec;
  ASSERT_EQ(NormalizeJobSpec(&normalized), absl::OkStatus());
  const std::string yaml = JobSpecToYaml(normalized);
  EXPECT_THAT(yaml, HasSubstr("seed_everything: 42"));
  EXPECT_THAT(yaml, HasSubstr("max_epochs: 2"));
  EXPECT_THAT(yaml, Not(HasSubstr("stage")));
  const v1::JobSpec again = PrintedAndReadBack(normalized, "printed.yaml");
  EXPECT_EQ(again.checkpoint().storage_options().at("region"), "eu");
}

// A config with lists of messages (data.shards.fields) prints and reads back too: the printer
// once called reflection's string getter on them, which aborts the process.
TEST(JobConfig, PrintedShardConfig_ListsOfMessagesReadBack) {
  auto spec = ParseJobSpec(R"(name: shards
model: {builtin: cnn}
data:
  shards:
    train: "/d/train-{000000..000003}.tar"
    fields:
      - {name: "jpg;png", type: image}
      - {name: cls, type: int}
)");
  ASSERT_TRUE(spec.ok()) << spec.status();
  v1::JobSpec normalized = *spec;
  ASSERT_EQ(NormalizeJobSpec(&normalized), absl::OkStatus());
  EXPECT_THAT(JobSpecToYaml(normalized), HasSubstr("{name: \"jpg;png\", type: \"image\""));
  const v1::JobSpec again = PrintedAndReadBack(normalized, "printed-shards.yaml");
  ASSERT_EQ(again.data().shards().fields_size(), 2);
  EXPECT_EQ(again.data().shards().fields(1).type(), "int");
}

// Lightning's int-or-float limits, words for numbers, and its defaults.
TEST(JobSpecRules, LightningFlags_ReadAsLightningReadsThem) {
  const std::string base = "model: {builtin: mlp}\ndata: {synthetic: {train_size: 10}}\n";
  auto spec = ParseJobSpec(base +
                           "trainer: {limit_val_batches: 0.25, limit_test_batches: 10, "
                           "limit_train_batches: 1.0, limit_predict_batches: 0, devices: auto, "
                           "overfit_batches: 0.0, fast_dev_run: false}");
  ASSERT_TRUE(spec.ok()) << spec.status();
  const v1::TrainerConfig& t = spec->trainer();
  EXPECT_TRUE(t.has_limit_val_fraction());
  EXPECT_DOUBLE_EQ(t.limit_val_fraction(), 0.25);
  EXPECT_TRUE(t.has_limit_test_batches());
  EXPECT_EQ(t.limit_test_batches(), 10);
  EXPECT_TRUE(t.has_limit_train_fraction());  // 1.0 is all of them, not one batch
  EXPECT_DOUBLE_EQ(t.limit_train_fraction(), 1.0);
  EXPECT_TRUE(t.has_limit_predict_batches());
  EXPECT_TRUE(t.has_overfit_fraction());
  EXPECT_TRUE(t.has_devices());
  EXPECT_EQ(t.devices(), 0);
  ASSERT_TRUE(NormalizeJobSpec(&*spec).ok());
  EXPECT_EQ(spec->trainer().devices(), 1);  // auto on a CPU, as Lightning's
  EXPECT_EQ(spec->trainer().max_epochs(), kLightningDefaultEpochs);
  EXPECT_EQ(spec->trainer().num_sanity_val_steps(), 2);
  EXPECT_EQ(spec->trainer().log_every_n_steps(), 50);
  EXPECT_TRUE(spec->data().shuffle());  // overfit_batches 0.0 is off

  auto quick = ParseJobSpec(base + "trainer: {fast_dev_run: true, max_epochs: 5}");
  ASSERT_TRUE(quick.ok()) << quick.status();
  EXPECT_EQ(quick->trainer().fast_dev_run(), 1);
  ASSERT_TRUE(NormalizeJobSpec(&*quick).ok());
  EXPECT_EQ(quick->trainer().max_epochs(), 1);
  EXPECT_EQ(quick->trainer().limit_train_batches(), 1);
  EXPECT_EQ(quick->trainer().limit_predict_batches(), 1);
  EXPECT_EQ(quick->trainer().num_sanity_val_steps(), 0);

  auto overfit = ParseJobSpec(base + "trainer: {overfit_batches: 3, max_epochs: -1}");
  ASSERT_TRUE(overfit.ok()) << overfit.status();
  ASSERT_TRUE(NormalizeJobSpec(&*overfit).ok());
  EXPECT_EQ(overfit->trainer().limit_train_batches(), 3);
  EXPECT_EQ(overfit->trainer().limit_val_batches(), 3);
  EXPECT_FALSE(overfit->data().shuffle());
  EXPECT_EQ(overfit->trainer().max_epochs(), kNoEpochLimit);

  // max_steps alone bounds the run, as in Lightning.
  auto steps = ParseJobSpec(base + "trainer: {max_steps: 7}");
  ASSERT_TRUE(steps.ok());
  ASSERT_TRUE(NormalizeJobSpec(&*steps).ok());
  EXPECT_EQ(steps->trainer().max_epochs(), kNoEpochLimit);
}

TEST(JobSpecRules, BadValues_NamedByPath) {
  struct Case {
    std::string text;
    std::string message;
  };
  const std::string base = "model: {builtin: mlp}\ndata: {synthetic: {train_size: 10}}\n";
  const std::vector<Case> cases = {
      {"data: {synthetic: {train_size: 10}}", "model: give builtin"},
      {"model: {builtin: mlp}", "data: give builtin"},
      {base + "trainer: {max_epochs: -2}", "trainer.max_epochs: must be >= -1"},
      {base + "trainer: {limit_val_batches: 1.5}", "trainer.limit_val_fraction: must be in [0, 1]"},
      {base + "trainer: {devices: auto, accelerator: gpu}",
       "trainer.devices: auto on gpu is not resolved by dtrain"},
      {base + "trainer: {fast_dev_run: -1}", "trainer.fast_dev_run: must be in [0, 1000000]"},
      {base + "trainer: {strategy: fsdp9}", "trainer.strategy: unknown strategy 'fsdp9'"},
      {base + "trainer: {precision: 8-true}", "trainer.precision: unknown precision '8-true'"},
      {base + "trainer: {strategy: dp, num_nodes: 2}",
       "trainer.num_nodes: strategy dp runs in one process"},
      {base + "trainer: {strategy: ddp_spawn, num_nodes: 17, devices: 256}",
       "trainer.num_nodes: 17 workers of 256 ranks each (trainer.devices under ddp_spawn) make "
       "4352 ranks; a group holds at most 4096"},
      {base + "trainer: {val_check_interval: 2.5}",
       "trainer.val_check_interval: above 1 it counts batches"},
      {base + "optimizer: {name: lion}",
       "optimizer.name: unknown optimizer 'lion'; use sgd, adam, adamw"},
      {base + "optimizer: {lr: -1}", "optimizer.lr: must be in"},
      {base + "optimizer: {nesterov: true}", "optimizer.nesterov: needs momentum > 0"},
      {base + "lr_scheduler: {name: cyclic}", "lr_scheduler.name: unknown lr scheduler 'cyclic'"},
      {base + "checkpoint: {mode: biggest}",
       "checkpoint.mode: unknown mode 'biggest'; use min, max"},
      {base + "name: 'a b'", "name: 'a b' may hold only letters"},
      {"model: {builtin: resnet}\ndata: {synthetic: {train_size: 10}}",
       "model.builtin: unknown model 'resnet'"},
      {"model: {builtin: mlp}\ndata: {shards: {fields: [{name: npy}]}}",
       "data.shards: give train (or predict, for predict only)"},
      {"model: {builtin: mlp}\ndata: {shards: {train: 'worker:/d/a.tar'}}",
       "data.shards.fields: name the fields that make a batch"},
      {"model: {builtin: mlp}\ndata: {shards: {train: 'worker:/d/a.tar', fields: [{name: npy}, "
       "{name: cls, type: integer}]}}",
       "data.shards.fields[1].type: unknown field type 'integer'; use image, int, float"},
      {"model: {builtin: mlp}\ndata: {shards: {train: 'worker:/d/a.tar', fields: [{type: int}]}}",
       "data.shards.fields[0].name: give the field's extension"},
      {"model: {builtin: mlp}\ndata: {shards: {train: 'worker:/d/a.tar', fields: [{name: npy}], "
       "on_error: ignore}}",
       "data.shards.on_error: unknown on_error policy 'ignore'; use fail, skip"},
  };
  // As the coordinator checks: against what its workers offer (here nothing).
  const OfferedPlugins none;
  for (const Case& c : cases) {
    auto spec = ParseJobSpec(c.text);
    ASSERT_TRUE(spec.ok()) << c.text << ": " << spec.status();
    absl::Status s = NormalizeJobSpec(&*spec, &none);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.message)) << c.text;
  }
  // The client cannot know the cluster's plugins: a well-formed name passes there, a malformed
  // one does not; the coordinator accepts a name a worker offers.
  auto plugin = ParseJobSpec(base + "trainer: {strategy: fsdp9}");
  EXPECT_TRUE(NormalizeJobSpec(&*plugin).ok());
  auto malformed = ParseJobSpec(base + "trainer: {strategy: 'Not A Name'}");
  EXPECT_EQ(NormalizeJobSpec(&*malformed).code(), absl::StatusCode::kInvalidArgument);
  const OfferedPlugins offered = {{{"strategy", "fsdp9"}, {"w0"}}};
  auto offered_plugin = ParseJobSpec(base + "trainer: {strategy: fsdp9}");
  EXPECT_TRUE(NormalizeJobSpec(&*offered_plugin, &offered).ok());
  EXPECT_EQ(PluginsNamedBy(*offered_plugin),
            (std::vector<std::pair<std::string, std::string>>{{"strategy", "fsdp9"}}));
  auto tpu = ParseJobSpec(base + "trainer: {strategy: tpu_spawn}");
  absl::Status s = NormalizeJobSpec(&*tpu);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("XLA runtime"));
  // accelerator: tpu is refused at submit too, naming the runtime, not as an unknown name.
  auto tpu_accelerator = ParseJobSpec(base + "trainer: {accelerator: tpu}");
  s = NormalizeJobSpec(&*tpu_accelerator);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("trainer.accelerator: 'tpu' needs an XLA runtime"));
  // nccl is refused by name, saying where CUDA gradients travel instead; a misspelling is not.
  auto nccl = ParseJobSpec(base + "trainer: {collective_backend: nccl}");
  s = NormalizeJobSpec(&*nccl);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("trainer.collective_backend: 'nccl' is not built: dtrain has no NCCL"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("through host memory"));
  auto typo = ParseJobSpec(base + "trainer: {collective_backend: ncl}");
  EXPECT_EQ(NormalizeJobSpec(&*typo).code(), absl::StatusCode::kInvalidArgument);
  // The collective plane: auto unless asked.
  auto plain = ParseJobSpec(base);
  ASSERT_TRUE(NormalizeJobSpec(&*plain).ok());
  EXPECT_EQ(plain->trainer().collective_backend(), "auto");
}

TEST(DistributedSampler, EqualShardsCoverEverySampleAndShufflePerEpoch) {
  constexpr int64_t n = 103;
  constexpr int world = 4;
  std::multiset<int64_t> seen;
  for (int r = 0; r < world; ++r) {
    const auto shard = TrainShard(n, world, r, true, 7, 0);
    EXPECT_EQ(shard.size(), 26u) << "ceil(103 / 4): every rank the same, so no rank waits";
    seen.insert(shard.begin(), shard.end());
  }
  EXPECT_EQ(seen.size(), 104u);  // one sample repeated as padding
  for (int64_t i = 0; i < n; ++i) EXPECT_GE(seen.count(i), 1u) << i;
  EXPECT_EQ(TrainShard(n, world, 1, true, 7, 0), TrainShard(n, world, 1, true, 7, 0));
  EXPECT_NE(TrainShard(n, world, 1, true, 7, 0), TrainShard(n, world, 1, true, 7, 1));
  EXPECT_EQ(TrainShard(8, 2, 1, false, 7, 3), (std::vector<int64_t>{1, 3, 5, 7}));
  // Evaluation: not padded, every sample exactly once.
  size_t total = 0;
  for (int r = 0; r < world; ++r) total += EvalShard(n, world, r).size();
  EXPECT_EQ(total, 103u);
  const auto batches = Batches(EvalShard(10, 1, 0), 4);
  ASSERT_EQ(batches.size(), 3u);
  EXPECT_EQ(batches[2], (std::vector<int64_t>{8, 9}));
}

// Workers deal their own shards (LocalWork.sampled), so the deal is a function of the code
// alone: a seed's permutation is pinned here, and a change to it needs a new kSamplerDeal.
TEST(DistributedSampler, TheDealIsPinned_EveryOrderEquallyLikely) {
  EXPECT_STREQ(kSamplerDeal, "fisher-yates-mt19937_64/1");
  EXPECT_EQ(TrainShard(10, 1, 0, true, 7, 0), (std::vector<int64_t>{2, 4, 0, 7, 9, 3, 6, 5, 8, 1}));
  EXPECT_EQ(TrainIndices(10, 2, 1, /*streamed=*/false, true, 7, 0),
            TrainShard(10, 2, 1, true, 7, 0));
  EXPECT_EQ(TrainIndices(10, 3, 2, /*streamed=*/true, true, 7, 0), (std::vector<int64_t>{0, 1, 2}));
  // 6,000 seeds: each of the 6 orders of 3 samples ~1,000 times (4 sigma: 115).
  std::map<std::vector<int64_t>, int> orders;
  for (uint64_t seed = 0; seed < 6000; ++seed) ++orders[TrainShard(3, 1, 0, true, seed, 0)];
  ASSERT_EQ(orders.size(), 6u);
  for (const auto& [order, count] : orders) {
    EXPECT_GT(count, 885) << order[0] << order[1] << order[2];
    EXPECT_LT(count, 1115) << order[0] << order[1] << order[2];
  }
}

TEST(TfEvents, Crc32cAndRecordsReadBack) {
  // The standard CRC-32C check value.
  EXPECT_EQ(Crc32c("123456789", 9), 0xE3069283u);
  // A directory of its own: the writer names its file by the second and the host, which another
  // run at the same second would share.
  const std::string dir = testing::TestTempPath("events");
  std::filesystem::create_directories(dir);
  auto writer = TfEventsWriter::Create(dir, "testhost");
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE((*writer)->AddScalar("val_acc", 0.875, 42, 1000.5).ok());
  ASSERT_TRUE((*writer)->Flush().ok());
  std::ifstream in((*writer)->path(), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Walk the records as TensorBoard's reader does, checking both CRCs.
  std::vector<v1::TfEvent> events;
  size_t at = 0;
  while (at < bytes.size()) {
    ASSERT_LE(at + 12, bytes.size());
    uint64_t length = 0;
    for (int i = 0; i < 8; ++i) length |= uint64_t{static_cast<uint8_t>(bytes[at + i])} << (8 * i);
    auto u32 = [&](size_t p) {
      uint32_t v = 0;
      for (int i = 0; i < 4; ++i) v |= uint32_t{static_cast<uint8_t>(bytes[p + i])} << (8 * i);
      return v;
    };
    EXPECT_EQ(u32(at + 8), MaskedCrc32c(bytes.data() + at, 8));
    ASSERT_LE(at + 12 + length + 4, bytes.size());
    EXPECT_EQ(u32(at + 12 + length), MaskedCrc32c(bytes.data() + at + 12, length));
    v1::TfEvent event;
    ASSERT_TRUE(event.ParseFromArray(bytes.data() + at + 12, static_cast<int>(length)));
    events.push_back(event);
    at += 12 + length + 4;
  }
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].file_version(), "brain.Event:2");
  EXPECT_EQ(events[1].step(), 42);
  EXPECT_EQ(events[1].summary().value(0).tag(), "val_acc");
  EXPECT_FLOAT_EQ(events[1].summary().value(0).simple_value(), 0.875f);
}

TEST(MetricsPlot, SvgHasBothPanelsAndEverySeries) {
  std::vector<v1::MetricPoint> points;
  for (int step = 0; step < 5; ++step) {
    v1::MetricPoint p;
    p.set_name("train_loss");
    p.set_step(step * 10);
    p.set_value(2.0 / (step + 1));
    points.push_back(p);
    p.set_name("val_acc");
    p.set_value(0.5 + step * 0.1);
    points.push_back(p);
  }
  const std::string svg = MetricsSvg("job-1", points);
  EXPECT_THAT(svg, HasSubstr("<svg"));
  EXPECT_THAT(svg, HasSubstr(">loss<"));
  EXPECT_THAT(svg, HasSubstr(">accuracy<"));
  EXPECT_THAT(svg, HasSubstr("train_loss (last 0.4)"));
  EXPECT_THAT(svg, HasSubstr("val_acc (last 0.9)"));
  const std::string png = testing::TestTempPath("x.png");
  EXPECT_EQ(WriteMetricsPlot(png, "j", points).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(std::filesystem::exists(png)) << "a refused plot writes nothing";
}

TEST(ProgressView, LineShowsEpochBarStepLossRateAndEta) {
  v1::JobStatus s;
  s.set_id("fashion-cnn-1");
  s.set_state(v1::RUNNING);
  v1::JobProgress* p = s.mutable_progress();
  p->set_phase("train");
  p->set_epoch(0);
  p->set_max_epochs(2);
  p->set_global_step(50);
  p->set_total_steps(100);
  p->set_train_loss(0.41234);
  p->set_samples_per_second(1234);
  p->set_eta_seconds(83);
  EXPECT_EQ(ProgressLine(s, 10),
            "fashion-cnn-1 RUNNING train epoch 1/2 [#####.....] step 50/100 "
            "loss 0.4123 1234 samples/s ETA 1m23s");
  // Once the coordinator reports the training rate, that is the one shown.
  p->set_train_samples_per_second(1500);
  EXPECT_EQ(ProgressLine(s, 10),
            "fashion-cnn-1 RUNNING train epoch 1/2 [#####.....] step 50/100 "
            "loss 0.4123 1500 samples/s ETA 1m23s");
  p->set_train_samples_per_second(1234);
  // Lightning's prog_bar keys, with their latest values; one not logged yet is left out.
  p->add_prog_bar("val_acc");
  p->add_prog_bar("train_f1_step");
  (*s.mutable_metrics())["val_acc"] = 0.91234;
  EXPECT_EQ(ProgressLine(s, 10),
            "fashion-cnn-1 RUNNING train epoch 1/2 [#####.....] step 50/100 "
            "loss 0.4123 1234 samples/s ETA 1m23s val_acc 0.9123");
  s.set_state(v1::FAILED);
  s.set_reason("worker 'w' (rank 1): boom");
  EXPECT_EQ(ProgressLine(s), "fashion-cnn-1 FAILED: worker 'w' (rank 1): boom");
}

}  // namespace job_spec_test
}  // namespace dtrain
