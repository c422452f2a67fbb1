// One job on one rank, in process (worker/job.h): what Setup prepares before any training (the
// checkpoint directory), the module's mode in each kind of step (train for training, eval for
// validation, test and predict, whatever mode it was exported in), and schedules that take their
// length from the run.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/script.h>

#include "absl/strings/str_cat.h"
#include "worker/job.h"

namespace dtrain {
namespace {

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
    r.mutable_model()->set_builtin("mlp");
  } else {
    r.mutable_model()->set_torchscript(model_path);
  }
  r.mutable_optimizer()->set_name("sgd");
  r.mutable_optimizer()->set_lr(0.1);
  r.set_strategy("single_device");
  r.set_seed(1);
  v1::SyntheticDataSpec* data = r.mutable_data()->mutable_synthetic();
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

std::unique_ptr<Job> SetupOrDie(const v1::SetupRequest& request) {
  absl::StatusOr<std::unique_ptr<Job>> job = Job::Setup(request, Identity());
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

TEST(JobSetup, CheckpointDirectory_CreatedBeforeTraining_OrTheSetupFailsNamingIt) {
  const std::string dir = TempPath("new/nested/checkpoints");
  std::filesystem::remove_all(TempPath("new"));
  v1::SetupRequest request = Request("dirpath");
  request.set_checkpoint_dir(dir);
  ASSERT_NE(SetupOrDie(request), nullptr);
  EXPECT_TRUE(std::filesystem::is_directory(dir));
  EXPECT_TRUE(std::filesystem::is_empty(dir)) << "the write check left its file behind";

  // Under a regular file no directory can be made (a permission check would pass as root).
  const std::string file = TempPath("a-file");
  std::ofstream(file) << "x";
  request.set_checkpoint_dir(file + "/checkpoints");
  absl::StatusOr<std::unique_ptr<Job>> refused = Job::Setup(request, Identity());
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_THAT(refused.status().message(),
              HasSubstr("checkpoint_dir: cannot create the checkpoint directory '" + file +
                        "/checkpoints'"));
}

TEST(JobSchedules, CosineWithoutTotalSteps_TakesTheRunsLength) {
  v1::SetupRequest request = Request("cosine");
  request.mutable_lr_scheduler()->set_name("cosine");
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

}  // namespace
}  // namespace dtrain
