// One job on one rank, in process (worker/runtime/job.h): what Setup prepares before any training
// (the checkpoint directory), the module's mode in each kind of step (train for training, eval for
// validation, test and predict, whatever mode it was exported in), schedules that take their
// length from the run, and checkpoints both ways with Python and in dtrain's older format.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/python/update_graph_executor_opt.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/optim/sgd.h>
#include <torch/script.h>
#include <torch/serialize.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "tests/test_support.h"
#include "worker/model/torch_save_file.h"
#include "worker/runtime/job.h"
#include "worker/service/setup_paths.h"

namespace dtrain {
namespace worker_job_test {

using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  return absl::StrCat(::testing::TempDir(), "/job-test-", getpid(), "-", name);
}

// A LightningModule with BatchNorm and Dropout, saved in train mode (as torch.jit.script of a
// fresh nn.Module is): in train mode its outputs are random and its running statistics move.
std::string SaveDropoutBatchNormModel() {
  const std::string path = TempPath("dropout-bn.pt");
  torch::manual_seed(3);
  torch::jit::Module m("DropoutBatchNorm");
  m.register_parameter("w", (torch::randn({10, 784}) * 0.01).requires_grad_(true), false);
  m.register_parameter("b", torch::zeros({10}).requires_grad_(true), false);
  m.register_parameter("bn_weight", torch::ones({784}).requires_grad_(true), false);
  m.register_parameter("bn_bias", torch::zeros({784}).requires_grad_(true), false);
  m.register_buffer("running_mean", torch::zeros({784}));
  m.register_buffer("running_var", torch::ones({784}));
  m.register_attribute("training", c10::BoolType::get(), true);
  m.define(R"(
def forward(self, x: Tensor) -> Tensor:
    h = torch.batch_norm(x.flatten(1), self.bn_weight, self.bn_bias, self.running_mean,
                         self.running_var, self.training, 0.1, 1e-5, False)
    h = torch.dropout(h, 0.5, self.training)
    return torch.linear(h, self.w, self.b)

def training_step(self, batch: Tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
    x, y = batch
    return torch.nll_loss(torch.log_softmax(self.forward(x), 1), y)

def validation_step(self, batch: Tuple[Tensor, Tensor], batch_idx: int) -> Dict[str, Tensor]:
    x, y = batch
    return {"loss": torch.nll_loss(torch.log_softmax(self.forward(x), 1), y)}
)");
  m.train(true);
  m.save(path);
  return path;
}

v1::SetupRequest Request(const std::string& job_id, const std::string& model_path = "") {
  v1::SetupRequest r;
  r.set_job_id(job_id);
  if (model_path.empty()) {
    r.mutable_spec()->mutable_model()->set_builtin("mlp");
  } else {
    r.mutable_spec()->mutable_model()->set_torchscript(model_path);
  }
  r.mutable_spec()->mutable_optimizer()->set_name("sgd");
  r.mutable_spec()->mutable_optimizer()->set_lr(0.1);
  r.mutable_spec()->mutable_trainer()->set_strategy("single_device");
  r.mutable_spec()->set_seed_everything(1);
  v1::SyntheticDataSpec* data = r.mutable_spec()->mutable_data()->mutable_synthetic();
  data->set_train_size(256);
  data->set_val_size(64);
  data->set_seed(5);
  return r;
}

WorkerIdentity Identity() {
  WorkerIdentity identity;
  identity.name = "w";
  identity.host = "h";
  return identity;
}

// As the worker's service sets a job up: the request prepared (its spec normalized, its paths
// local), then the job.
absl::StatusOr<std::unique_ptr<Job>> SetupJob(v1::SetupRequest request) {
  DTRAIN_RETURN_IF_ERROR(PrepareSetup(&request, /*devices=*/1, /*cache=*/nullptr));
  return Job::Setup(request, Identity());
}

std::unique_ptr<Job> SetupOrDie(const v1::SetupRequest& request) {
  absl::StatusOr<std::unique_ptr<Job>> job = SetupJob(request);
  EXPECT_TRUE(job.ok()) << job.status();
  return job.ok() ? std::move(*job) : nullptr;
}

v1::LocalWork Work(const std::string& split, int first, int n) {
  v1::LocalWork work;
  v1::IndexBatch* batch = work.add_index_batches();
  batch->set_split(split);
  for (int i = first; i < first + n; ++i) batch->add_indices(i);
  return work;
}

double ValidationLoss(Job& job) {
  absl::StatusOr<v1::LocalResult> r =
      job.Evaluate(StepKind::kValidation, Work("val", 0, 32), /*return_outputs=*/false);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? r->batches(0).scalars().at("loss") : NAN;
}

torch::Tensor RunningMean(Job& job) {
  return job.accelerator().LightningModuleStateDict().at("running_mean").clone();
}

TEST(JobModes, ValidateOnly_EvalModeFromTheStart_SameOutputsAndStatisticsUntouched) {
  std::unique_ptr<Job> job = SetupOrDie(Request("validate-only", SaveDropoutBatchNormModel()));
  ASSERT_NE(job, nullptr);
  const double first = ValidationLoss(*job);
  EXPECT_EQ(ValidationLoss(*job), first) << "dropout was active: the module ran in train mode";
  EXPECT_TRUE(torch::equal(RunningMean(*job), torch::zeros({784})))
      << "BatchNorm's running statistics moved during validation";
}

// A listed batch past the spec's largest batch is refused before a row is made: its indices
// cost 8 bytes each in the worker, and a row each after that.
TEST(JobModes, IndexBatchPastTheLargestBatch_RefusedBeforeAnyRowIsMade) {
  std::unique_ptr<Job> job = SetupOrDie(Request("too-many-rows", SaveDropoutBatchNormModel()));
  ASSERT_NE(job, nullptr);
  v1::LocalWork work = Work("val", 0, 8);
  work.mutable_index_batches(0)->mutable_indices()->Resize(1048577, 0);
  absl::StatusOr<v1::LocalResult> r =
      job->Evaluate(StepKind::kValidation, work, /*return_outputs=*/false);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("index batch 0 holds 1048577 indices; a batch holds at most 1048576"));
  EXPECT_TRUE(job->Evaluate(StepKind::kValidation, Work("val", 0, 8), false).ok());
}

TEST(JobModes, Fit_TrainsInTrainMode_ValidatesInEvalMode_ThenTrainsAgain) {
  std::unique_ptr<Job> job = SetupOrDie(Request("fit", SaveDropoutBatchNormModel()));
  ASSERT_NE(job, nullptr);
  ASSERT_TRUE(job->Train(Work("train", 0, 32), 0).ok());
  const torch::Tensor after_training = RunningMean(*job);
  EXPECT_FALSE(torch::equal(after_training, torch::zeros({784})))
      << "training did not update BatchNorm's running statistics: not in train mode";
  const double first = ValidationLoss(*job);
  EXPECT_EQ(ValidationLoss(*job), first);
  EXPECT_TRUE(torch::equal(RunningMean(*job), after_training));
  ASSERT_TRUE(job->Train(Work("train", 32, 32), 0).ok());
  EXPECT_FALSE(torch::equal(RunningMean(*job), after_training)) << "back in train mode";
}

// A CPU job's model code never builds the graph executor's optimized plan
// (worker/model/script_execution.h), whichever of the Job's entry points ran it first.
TEST(JobModes, CpuJobRunsTorchScriptUnoptimized_TrainingAndValidation) {
  std::unique_ptr<Job> job = SetupOrDie(Request("fit", SaveDropoutBatchNormModel()));
  ASSERT_NE(job, nullptr);
  for (int call = 0; call < 3; ++call) {
    ASSERT_TRUE(job->Train(Work("train", 8 * call, 8), 0).ok());
    ValidationLoss(*job);
  }
  torch::jit::Module& module = job->accelerator().model().module();
  for (const char* method : {"training_step", "validation_step"}) {
    EXPECT_FALSE(torch::jit::toGraphFunction(module.get_method(method).function())
                     .get_executor()
                     .isOptimized())
        << method << " runs the optimized plan";
  }
  EXPECT_TRUE(torch::jit::getGraphExecutorOptimize()) << "the test's own thread was changed";
}

// Lightning's sanity check runs under isolate_rng: a validation_step that draws random numbers
// leaves the CPU generator where it was, so training draws what it would have without it.
TEST(JobModes, SanityCheck_PutsTheRandomGeneratorBack) {
  const std::string model = TempPath("noisy-model.pt");
  torch::jit::Module m("Noisy");
  m.register_parameter("w", torch::zeros({10, 784}).requires_grad_(true), false);
  m.define(R"(
def training_step(self, batch: Tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
    return torch.nll_loss(torch.log_softmax(torch.linear(batch[0], self.w), 1), batch[1])

def validation_step(self, batch: Tuple[Tensor, Tensor], batch_idx: int) -> Dict[str, Tensor]:
    return {"noise": torch.rand(3).sum()}
)");
  m.save(model);
  std::unique_ptr<Job> job = SetupOrDie(Request("noisy", model));
  ASSERT_NE(job, nullptr);
  torch::manual_seed(3);
  const torch::Tensor untouched = torch::rand({4});
  torch::manual_seed(3);
  ASSERT_TRUE(
      job->Evaluate(StepKind::kValidation, Work("val", 0, 8), false, /*sanity_check=*/true).ok());
  EXPECT_TRUE(torch::equal(torch::rand({4}), untouched));
  // The same validation outside a sanity check draws from the generator.
  torch::manual_seed(3);
  ASSERT_TRUE(job->Evaluate(StepKind::kValidation, Work("val", 0, 8), false).ok());
  EXPECT_FALSE(torch::equal(torch::rand({4}), untouched));
}

TEST(JobSetup, CheckpointDirectory_CreatedBeforeTraining_OrTheSetupFailsNamingIt) {
  const std::string dir = TempPath("new/nested/checkpoints");
  std::filesystem::remove_all(TempPath("new"));
  v1::SetupRequest request = Request("dirpath");
  // As the spec names it: marked, a directory on every worker.
  request.mutable_spec()->mutable_checkpoint()->set_dirpath("worker:" + dir);
  ASSERT_NE(SetupOrDie(request), nullptr);
  EXPECT_TRUE(std::filesystem::is_directory(dir));
  EXPECT_TRUE(std::filesystem::is_empty(dir)) << "the write check left its file behind";

  // Under a regular file no directory can be made (a permission check would pass as root).
  const std::string file = TempPath("a-file");
  std::ofstream(file) << "x";
  request.mutable_spec()->mutable_checkpoint()->set_dirpath(file + "/checkpoints");
  absl::StatusOr<std::unique_ptr<Job>> refused = SetupJob(request);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_THAT(refused.status().message(),
              HasSubstr("spec.checkpoint.dirpath: cannot create the checkpoint directory '" + file +
                        "/checkpoints'"));
}

TEST(JobSchedules, CosineWithoutTotalSteps_TakesTheRunsLength) {
  v1::SetupRequest request = Request("cosine");
  request.mutable_spec()->mutable_lr_scheduler()->set_name("cosine");
  std::unique_ptr<Job> job = SetupOrDie(request);
  ASSERT_NE(job, nullptr);
  absl::StatusOr<v1::LocalResult> unknown = job->Train(Work("train", 0, 8), 0);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(unknown.status().message(), HasSubstr("StepRequest.total_steps"));
  ASSERT_TRUE(job->Train(Work("train", 0, 8), 0, false, /*total_steps=*/10).ok());
  absl::StatusOr<v1::LocalResult> second = job->Train(Work("train", 8, 8), 0, false, 10);
  ASSERT_TRUE(second.ok()) << second.status();
  // The second optimizer step (step 1 of 10) at 0.1 * (1 + cos(pi / 10)) / 2.
  EXPECT_NEAR(second->lr(), 0.1 * (1 + std::cos(M_PI / 10)) / 2, 1e-12);
}

// Runs `script` with Debian's python3 and its torch (python3-torch).
void Python(const std::string& script) {
  testing::CommandResult run = testing::RunTorchPython(script);
  ASSERT_EQ(run.exit_code, 0) << run.output;
}

TEST(JobSchedules, CosineSavedBeforeAnyStep_WritesTheRunsLengthTheSaveCarries) {
  v1::SetupRequest request = Request("cosine-save");
  request.mutable_spec()->mutable_lr_scheduler()->set_name("cosine");
  std::unique_ptr<Job> job = SetupOrDie(request);
  ASSERT_NE(job, nullptr);
  // A run resumed at its very end saves with no step since: only the save knows the length.
  const std::string carried = TempPath("carried.ckpt");
  ASSERT_TRUE(job->SaveCheckpoint(carried, 0, "", /*total_steps=*/40).ok());
  const std::string unknown = TempPath("unknown.ckpt");
  ASSERT_TRUE(SetupOrDie(request)->SaveCheckpoint(unknown, 0, "").ok());
  EXPECT_EQ(job->SaveCheckpoint(TempPath("bad.ckpt"), 0, "", -1).status().code(),
            absl::StatusCode::kInvalidArgument);
  Python(absl::StrCat("import math\nfor path, t_max in ((\"", carried, "\", 40), (\"", unknown,
                      R"(", 0)):
    s = torch.load(path, map_location="cpu")["lr_schedulers"][0]
    assert s["T_max"] == t_max, (path, s)
    # Step 0 of a cosine is its base rate; before the fix an unknown length wrote 0/0 (NaN).
    assert s["_last_lr"] == [0.1] and math.isfinite(s["_last_lr"][0]), s
    assert s["base_lrs"] == [0.1], s
)"));
}

// A model whose steps take the dict a user's DataLoader gives, trained on a file Python wrote.
TEST(JobData, DictBatches_ReachTheModelsTypedSteps) {
  const std::string file = TempPath("dict.pt");
  Python(absl::StrCat(R"(
g = torch.Generator().manual_seed(1)
torch.save({"train": {"features": torch.randn(64, 8, generator=g),
                      "target": torch.randint(0, 3, (64,), generator=g)},
            "val": [torch.randn(16, 8, generator=g), torch.randint(0, 3, (16,), generator=g)]},
           ")",
                      file, "\")\n"));
  const std::string model = TempPath("dict-model.pt");
  torch::jit::Module m("DictModel");
  m.register_parameter("w", (torch::randn({3, 8}) * 0.1).requires_grad_(true), false);
  m.define(R"(
def training_step(self, batch: Dict[str, Tensor], batch_idx: int) -> Dict[str, Tensor]:
    logits = torch.linear(batch["features"], self.w)
    acc = (logits.argmax(1) == batch["target"]).float().mean()
    return {"loss": torch.nll_loss(torch.log_softmax(logits, 1), batch["target"]), "acc": acc,
            "logits": logits}

def validation_step(self, batch: List[Tensor], batch_idx: int) -> Dict[str, Tensor]:
    logits = torch.linear(batch[0], self.w)
    return {"acc": (logits.argmax(1) == batch[1]).float().mean()}
)");
  m.save(model);
  v1::SetupRequest request = Request("dict", model);
  request.mutable_spec()->mutable_data()->set_tensors_file(file);
  std::unique_ptr<Job> job = SetupOrDie(request);
  ASSERT_NE(job, nullptr);
  absl::StatusOr<v1::LocalResult> trained = job->Train(Work("train", 0, 16), 0);
  ASSERT_TRUE(trained.ok()) << trained.status();
  EXPECT_GT(trained->batches(0).scalars().at("loss"), 0);
  // Every scalar training_step returns travels with the loss; a non-scalar one does not.
  ASSERT_EQ(trained->batches(0).scalars().count("acc"), 1u);
  const double acc = trained->batches(0).scalars().at("acc");
  EXPECT_TRUE(acc >= 0 && acc <= 1) << acc;
  EXPECT_EQ(trained->batches(0).scalars().count("logits"), 0u);
  absl::StatusOr<v1::LocalResult> validated =
      job->Evaluate(StepKind::kValidation, Work("val", 0, 16), false);
  ASSERT_TRUE(validated.ok()) << validated.status();
  EXPECT_EQ(validated->batches(0).scalars().count("acc"), 1u);
}

// Checkpoints in Lightning's layout, both ways against python3-torch: a module exported from
// Python trains 4 steps in dtrain, Python continues from dtrain's checkpoint for 4 more (and
// the other way round), and both end where an uninterrupted run ends.
class CheckpointInteropTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    model_ = TempPath(GetParam() + "-interop-model.pt");
    data_ = TempPath(GetParam() + "-interop-data.pt");
    Python(absl::StrCat(Head(), kPythonCommon, R"(
torch.manual_seed(0)
torch.jit.script(Net()).save(MODEL)
g = torch.Generator().manual_seed(1)
torch.save({"train": (torch.randn(64, 8, generator=g), torch.randint(0, 3, (64,), generator=g))},
           DATA)
)"));
  }

  // The common head of every script: paths, the module, the optimizer and the batches.
  std::string Head() const {
    return absl::StrCat("MODEL = '", model_, "'\nDATA = '", data_, "'\nOPT = '", GetParam(), "'\n");
  }
  static constexpr char kPythonCommon[] = R"(
from typing import Tuple
from torch import Tensor, nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))

    @torch.jit.export
    def training_step(self, batch: Tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self.forward(x), y)

def make_optimizer(params):
    if OPT == "sgd":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9)
    if OPT == "adam":
        return torch.optim.Adam(params, lr=0.01)
    return torch.optim.AdamW(params, lr=0.01, weight_decay=0.01)

def train(m, opt, steps):
    x, y = torch.load(DATA)["train"]
    for s in steps:
        idx = torch.arange(16 * s, 16 * s + 16) % 64
        loss = m.training_step((x[idx], y[idx]), s)
        opt.zero_grad()
        loss.backward()
        opt.step()
)";

  std::unique_ptr<Job> NewJob() {
    v1::SetupRequest request = Request("interop-" + GetParam(), model_);
    request.mutable_spec()->mutable_data()->set_tensors_file(data_);
    v1::OptimizerSpec* o = request.mutable_spec()->mutable_optimizer();
    o->set_name(GetParam());
    o->set_lr(GetParam() == "sgd" ? 0.05 : 0.01);
    if (GetParam() == "sgd") o->set_momentum(0.9);
    if (GetParam() == "adamw") o->set_weight_decay(0.01);
    return SetupOrDie(request);
  }

  static void Train(Job& job, int first, int last) {
    for (int s = first; s < last; ++s) {
      v1::LocalWork work;
      work.set_first_batch_idx(s);
      v1::IndexBatch* b = work.add_index_batches();
      b->set_split("train");
      for (int i = 0; i < 16; ++i) b->add_indices((16 * s + i) % 64);
      absl::StatusOr<v1::LocalResult> r = job.Train(work, 0);
      ASSERT_TRUE(r.ok()) << r.status();
    }
  }

  // The largest difference between the job's parameters and those Python saved at `path`.
  static double MaxDiff(Job& job, const std::string& path) {
    absl::StatusOr<c10::IValue> saved = ReadTorchSaveFile(path);
    EXPECT_TRUE(saved.ok()) << saved.status();
    if (!saved.ok()) return INFINITY;
    double worst = 0;
    int compared = 0;
    for (const auto& [name, tensor] : job.accelerator().LightningModuleStateDict()) {
      auto it = saved->toGenericDict().find(c10::IValue(name));
      EXPECT_NE(it, saved->toGenericDict().end()) << name;
      if (it == saved->toGenericDict().end()) return INFINITY;
      worst = std::max(worst, (tensor - it->value().toTensor()).abs().max().item<double>());
      ++compared;
    }
    EXPECT_EQ(compared, 4);
    return worst;
  }

  std::string model_, data_;
};

TEST_P(CheckpointInteropTest, DtrainCheckpoint_PythonContinues_SameAsUninterrupted) {
  std::unique_ptr<Job> job = NewJob();
  ASSERT_NE(job, nullptr);
  Train(*job, 0, 4);
  const std::string checkpoint = TempPath(GetParam() + "-dtrain.ckpt");
  ASSERT_TRUE(job->SaveCheckpoint(checkpoint, 0, "{\"name\": \"interop\"}").ok());
  Train(*job, 4, 8);
  const std::string out = TempPath(GetParam() + "-python-continued.pt");
  Python(absl::StrCat(Head(), kPythonCommon, R"(
ckpt = torch.load(')",
                      checkpoint, R"(')
assert ckpt["global_step"] == 4 and ckpt["epoch"] == 0, ckpt["global_step"]
assert ckpt["dtrain"]["format_version"] == 2 and ckpt["dtrain"]["strategy"] == "single_device"
assert ckpt["dtrain"]["job_spec"] == '{"name": "interop"}'
assert sorted(ckpt["state_dict"]) == ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"]
m = torch.jit.load(MODEL)
m.load_state_dict(ckpt["state_dict"])
opt = make_optimizer(m.parameters())
opt.load_state_dict(ckpt["optimizer_states"][0])
train(m, opt, range(4, 8))
torch.save(dict(m.state_dict()), ')",
                      out, "')\n"));
  EXPECT_LT(MaxDiff(*job, out), 1e-5);
}

TEST_P(CheckpointInteropTest, PythonCheckpoint_DtrainResumes_SameAsUninterrupted) {
  const std::string checkpoint = TempPath(GetParam() + "-python.ckpt");
  const std::string out = TempPath(GetParam() + "-python-uninterrupted.pt");
  Python(absl::StrCat(Head(), kPythonCommon, R"(
m = torch.jit.load(MODEL)
opt = make_optimizer(m.parameters())
train(m, opt, range(0, 4))
torch.save({"state_dict": m.state_dict(), "optimizer_states": [opt.state_dict()],
            "lr_schedulers": [], "epoch": 0, "global_step": 4,
            "pytorch-lightning_version": "1.9.0"}, ')",
                      checkpoint, R"(')
train(m, opt, range(4, 8))
torch.save(dict(m.state_dict()), ')",
                      out, "')\n"));
  std::unique_ptr<Job> job = NewJob();
  ASSERT_NE(job, nullptr);
  absl::StatusOr<TrainingProgress> progress = job->LoadCheckpoint(checkpoint);
  ASSERT_TRUE(progress.ok()) << progress.status();
  EXPECT_EQ(progress->global_step, 4);
  Train(*job, 4, 8);
  EXPECT_LT(MaxDiff(*job, out), 1e-5);
}

// A checkpoint refused mid-run (one optimizer state tensor of the wrong shape, after weights
// that would fit) restores nothing: the job goes on from its own weights and optimizer state,
// as if it had never loaded, and equals an uninterrupted Python run.
TEST_P(CheckpointInteropTest, RefusedCheckpoint_LeavesWeightsAndOptimizerStateAsTheyWere) {
  const std::string bad = TempPath(GetParam() + "-bad.ckpt");
  const std::string out = TempPath(GetParam() + "-bad-uninterrupted.pt");
  Python(absl::StrCat(Head(), kPythonCommon, R"(
m = torch.jit.load(MODEL)
opt = make_optimizer(m.parameters())
train(m, opt, range(0, 4))
s = opt.state_dict()
s["state"][1] = {k: (torch.zeros(3) if torch.is_tensor(v) and v.numel() > 1 else v)
                 for k, v in s["state"][1].items()}
torch.save({"state_dict": {k: v + 1 for k, v in m.state_dict().items()},
            "optimizer_states": [s], "epoch": 0, "global_step": 4}, ')",
                      bad, R"(')
train(m, opt, range(4, 8))
torch.save(dict(m.state_dict()), ')",
                      out, "')\n"));
  std::unique_ptr<Job> job = NewJob();
  ASSERT_NE(job, nullptr);
  Train(*job, 0, 4);
  absl::StatusOr<TrainingProgress> refused = job->LoadCheckpoint(bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("state 1 '"));
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("has shape [3]"));
  EXPECT_EQ(job->accelerator().progress().global_step, 4);
  Train(*job, 4, 8);
  EXPECT_LT(MaxDiff(*job, out), 1e-5);
}

// A parameter numbered with something other than an int (read as one, it would take another
// parameter's state) or numbered twice is refused, naming what is wrong; nothing changes.
TEST_P(CheckpointInteropTest, ParameterNumbersNotIntsOrTwice_RefusedNamingWhy) {
  const std::string as_float = TempPath(GetParam() + "-float-number.ckpt");
  const std::string twice = TempPath(GetParam() + "-twice.ckpt");
  Python(absl::StrCat(Head(), kPythonCommon, R"(
import copy
m = torch.jit.load(MODEL)
opt = make_optimizer(m.parameters())
train(m, opt, range(0, 4))
for path, number in ((')",
                      as_float, R"(', float("nan")), (')", twice, R"(', 0)):
    s = copy.deepcopy(opt.state_dict())
    s["param_groups"][0]["params"][1] = number
    torch.save({"state_dict": dict(m.state_dict()), "optimizer_states": [s], "epoch": 0,
                "global_step": 4}, path)
)"));
  std::unique_ptr<Job> job = NewJob();
  ASSERT_NE(job, nullptr);
  Train(*job, 0, 4);
  for (const auto& [path, says] :
       {std::pair<std::string, std::string>{as_float,
                                            "numbers a parameter with a Double, not "
                                            "an int"},
        {twice, "names parameter 0 twice in its param_groups"}}) {
    absl::StatusOr<TrainingProgress> refused = job->LoadCheckpoint(path);
    ASSERT_FALSE(refused.ok()) << path;
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
    EXPECT_THAT(std::string(refused.status().message()), HasSubstr(says));
    EXPECT_EQ(job->accelerator().progress().global_step, 4);
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, CheckpointInteropTest,
                         ::testing::Values("sgd", "adam", "adamw"));

// dtrain's format-1 checkpoint, written the way dtrain wrote it before format 2 (commit a460554,
// worker/checkpoint/checkpoint.cc's SaveCheckpoint): a libtorch archive holding
// `dtrain_checkpoint_version`, "model/<name>" for every parameter and buffer, the optimizer's own
// archive, global_step, epoch and the CPU generator's state.
void SaveFormat1Checkpoint(Job& job, const std::string& path) {
  torch::serialize::OutputArchive archive;
  archive.write("dtrain_checkpoint_version", torch::tensor(int64_t{1}));
  torch::jit::Module& module = job.accelerator().model().module();
  for (const auto& p : module.named_parameters()) {
    archive.write("model/" + p.name, p.value.detach(), /*is_buffer=*/false);
  }
  for (const auto& b : module.named_buffers()) {
    archive.write("model/" + b.name, b.value, /*is_buffer=*/true);
  }
  absl::StatusOr<torch::optim::Optimizer*> optimizer = job.accelerator().OptimizerState();
  ASSERT_TRUE(optimizer.ok()) << optimizer.status();
  torch::serialize::OutputArchive optimizer_archive;
  (*optimizer)->save(optimizer_archive);
  archive.write("optimizer", optimizer_archive);
  archive.write("global_step", torch::tensor(job.accelerator().progress().global_step));
  archive.write("epoch", torch::tensor(job.accelerator().progress().epoch));
  archive.write("rng_cpu", at::detail::getDefaultCPUGenerator().get_state());
  archive.save_to(path);
}

// One optimizer step per batch of 8 samples: steps [first, last).
void TrainSteps(Job& job, int first, int last) {
  for (int s = first; s < last; ++s) {
    absl::StatusOr<v1::LocalResult> r = job.Train(Work("train", 8 * s, 8), 0);
    ASSERT_TRUE(r.ok()) << r.status();
  }
}

// docs/checkpoints.md: dtrain's format-1 checkpoints are no longer read (issue 38). One is a
// libtorch archive, that is a TorchScript archive, and loading one runs the code it carries; it
// is refused naming the file before anything in it is read, and the reader's weights stay as
// they were.
TEST(CheckpointFormats, Format1Archive_RefusedAsCode_WeightsUntouched) {
  v1::SetupRequest request = Request("format-1");
  request.mutable_spec()->mutable_optimizer()->set_momentum(0.9);
  std::unique_ptr<Job> writer = SetupOrDie(request);
  ASSERT_NE(writer, nullptr);
  ASSERT_NO_FATAL_FAILURE(TrainSteps(*writer, 0, 4));
  const std::string path = TempPath("format-1.ckpt");
  ASSERT_NO_FATAL_FAILURE(SaveFormat1Checkpoint(*writer, path));

  std::unique_ptr<Job> reader = SetupOrDie(request);
  ASSERT_NE(reader, nullptr);
  const torch::Tensor before =
      reader->accelerator().LightningModuleStateDict().at("fc1_weight").clone();
  ASSERT_FALSE(
      torch::equal(before, writer->accelerator().LightningModuleStateDict().at("fc1_weight")))
      << "the reader holds the saved weights already: an untouched reader would prove nothing";
  absl::StatusOr<TrainingProgress> refused = reader->LoadCheckpoint(path);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("'" + path + "' is a TorchScript archive"));
  EXPECT_THAT(refused.status().message(), HasSubstr("never run as code"));
  EXPECT_TRUE(
      torch::equal(before, reader->accelerator().LightningModuleStateDict().at("fc1_weight")));
  EXPECT_EQ(reader->accelerator().progress().global_step, 0);
}

// Lightning's hooks at Lightning's moments, counted by the module into a buffer that the
// checkpoint then holds: calls[i] counts on_train_start, on_train_epoch_start,
// on_train_epoch_end, on_validation_epoch_start, on_validation_epoch_end, on_train_end,
// training_step_end, validation_step_end.
TEST(JobHooks, CalledAtLightningsMoments_CountsTravelInTheCheckpoint) {
  const std::string path = TempPath("hooks.pt");
  torch::jit::Module m("Hooks");
  m.register_parameter("w", (torch::randn({10, 784}) * 0.01).requires_grad_(true), false);
  m.register_buffer("calls", torch::zeros({8}, torch::kLong));
  m.define(R"(
def training_step(self, batch: Tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
    x, y = batch
    return torch.nll_loss(torch.log_softmax(torch.linear(x.flatten(1), self.w), 1), y)

def validation_step(self, batch: Tuple[Tensor, Tensor], batch_idx: int) -> Dict[str, Tensor]:
    return {"loss": self.training_step(batch, batch_idx)}

def test_step(self, batch: Tuple[Tensor, Tensor], batch_idx: int) -> Dict[str, Tensor]:
    return {"loss": self.training_step(batch, batch_idx)}

def training_step_end(self, out: Tensor) -> Tensor:
    self.calls[6] += 1
    return out * 1.0

def validation_step_end(self, out: Dict[str, Tensor]) -> Dict[str, Tensor]:
    self.calls[7] += 1
    return out

def on_train_start(self):
    self.calls[0] += 1

def on_train_epoch_start(self):
    self.calls[1] += 1

def on_train_epoch_end(self):
    self.calls[2] += 1

def on_validation_epoch_start(self):
    self.calls[3] += 1

def on_validation_epoch_end(self):
    self.calls[4] += 1

def on_train_end(self):
    self.calls[5] += 1
)");
  m.save(path);
  v1::SetupRequest request = Request("hooks", path);
  request.mutable_spec()->mutable_data()->mutable_synthetic()->set_test_size(16);
  std::unique_ptr<Job> job = SetupOrDie(request);
  ASSERT_NE(job, nullptr);
  // Epoch 0 in two calls, a validation of 2 batches, epoch 1 in one call.
  ASSERT_TRUE(job->Train(Work("train", 0, 8), 0).ok());
  ASSERT_TRUE(job->Train(Work("train", 8, 8), 0, /*end_of_epoch=*/true).ok());
  v1::LocalWork val = Work("val", 0, 8);
  *val.add_index_batches() = Work("val", 8, 8).index_batches(0);
  ASSERT_TRUE(job->Evaluate(StepKind::kValidation, val, false).ok());
  ASSERT_TRUE(job->Train(Work("train", 16, 8), 1, /*end_of_epoch=*/true).ok());
  const std::string checkpoint = TempPath("hooks.ckpt");
  ASSERT_TRUE(job->SaveCheckpoint(checkpoint, 1).ok());
  absl::StatusOr<c10::IValue> saved = ReadTorchSaveFile(checkpoint);
  ASSERT_TRUE(saved.ok()) << saved.status();
  const at::Tensor calls =
      saved->toGenericDict().at("state_dict").toGenericDict().at("calls").toTensor();
  EXPECT_TRUE(torch::equal(calls, torch::tensor({1, 2, 2, 1, 1, 0, 3, 2}, torch::kLong))) << calls;
  // Testing begins: fit is over.
  ASSERT_TRUE(job->Evaluate(StepKind::kTest, Work("test", 0, 8), false).ok());
  EXPECT_EQ(job->accelerator().LightningModuleStateDict().at("calls")[5].item<int64_t>(), 1);
}

}  // namespace worker_job_test
}  // namespace dtrain
