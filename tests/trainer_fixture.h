// The fixture of the trainer's in-process tests (trainer_test.cc: the loops;
// trainer_callbacks_test.cc: checkpoints and early stopping; trainer_flags_test.cc: the
// trainer's limits and debugging flags): a run of a spec on FakeWorkerGroup with a clock the test
// advances, and the record the trainer reports into.
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/distributed_sampler.h"
#include "common/job_spec.h"
#include "coordinator/jobs/testing/fake_worker_group.h"
#include "coordinator/jobs/trainer.h"

// A named (inline) namespace, not an anonymous one: the three files share the TrainerTest suite
// inside one test executable, so they must share one fixture type.
namespace dtrain {
inline namespace trainer_fixture {

using ::testing::ElementsAre;
using testing::FakeCall;
using testing::FakeCheckpointStore;
using testing::FakeWorkerGroup;
using testing::FakeWorkerGroupOptions;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

struct Point {
  std::string name;
  double value;
  int64_t step;
  int64_t epoch;
  int batch = 0;  // which Metrics call brought it (Record::metric_batches then)
};

// The job's record, as the trainer reports into it.
class Record final : public TrainerReporter {
 public:
  void Log(const std::string& line) override { lines.push_back(line); }
  void Progress(const v1::JobProgress& p) override { progress.push_back(p); }
  void Metrics(const std::vector<v1::MetricPoint>& batch) override {
    ++metric_batches;
    for (const v1::MetricPoint& p : batch) {
      points.push_back({p.name(), p.value(), p.step(), p.epoch(), metric_batches});
    }
  }
  void Checkpoint(const std::string& l, const std::string& b) override {
    last = l;
    best = b;
  }
  void KeepFile(const v1::JobFile& file, const std::vector<std::string>& dropped) override {
    kept.push_back(file);
    for (const std::string& d : dropped) this->dropped.push_back(d);
  }
  void Predictions(const std::string& path) override { predictions = path; }

  std::vector<Point> Named(const std::string& name) const {
    std::vector<Point> out;
    for (const Point& p : points) {
      if (p.name == name) out.push_back(p);
    }
    return out;
  }
  int Lines(const std::string& part) const {
    int n = 0;
    for (const std::string& line : lines) n += absl::StrContains(line, part) ? 1 : 0;
    return n;
  }
  std::string Line(const std::string& part) const {
    for (const std::string& line : lines) {
      if (absl::StrContains(line, part)) return line;
    }
    return "";
  }

  std::vector<std::string> lines;
  std::vector<v1::JobProgress> progress;
  std::vector<Point> points;
  int metric_batches = 0;  // Metrics calls: a training call's points arrive in one
  std::string last, best, predictions;
  std::vector<v1::JobFile> kept;
  std::vector<std::string> dropped;
};

// A clock that moves only when the test (or a call hook) says so.
class ManualClock {
 public:
  Clock clock() {
    return [this] { return now_; };
  }
  void Advance(absl::Duration d) { now_ += d; }

 private:
  absl::Time now_ = absl::FromUnixSeconds(1'000'000);
};

// 64 training samples over 2 ranks in batches of 8: 4 batches per rank per epoch.
inline v1::JobSpec Spec() {
  v1::JobSpec spec;
  spec.set_name("loops");
  spec.mutable_model()->set_builtin("mlp");
  spec.mutable_data()->mutable_synthetic()->set_train_size(64);
  spec.mutable_data()->set_batch_size(8);
  spec.mutable_data()->set_eval_batch_size(8);
  spec.mutable_trainer()->set_num_nodes(2);
  spec.mutable_trainer()->set_max_epochs(3);
  spec.mutable_trainer()->set_batches_per_call(1);
  spec.mutable_trainer()->set_log_every_n_steps(2);
  // The calls the tests expect are fit's own; trainer_flags_test runs the sanity check.
  spec.mutable_trainer()->set_num_sanity_val_steps(0);
  spec.mutable_optimizer()->set_lr(0.1);
  spec.set_seed_everything(7);
  return spec;
}

class TrainerTest : public ::testing::Test {
 protected:
  // A run of `spec` on two fake workers sharing `store_`. The group stays readable through
  // group() after Run.
  std::unique_ptr<Trainer> Make(v1::JobSpec spec, FakeWorkerGroupOptions fake = {}) {
    EXPECT_TRUE(NormalizeJobSpec(&spec).ok());
    fake.store = &store_;
    if (!fake.before_call) {
      fake.before_call = [this](const FakeCall& call) {
        if (call.what == "training_step") clock_.Advance(absl::Seconds(1));
        return absl::OkStatus();
      };
    }
    auto group = std::make_unique<FakeWorkerGroup>(std::move(fake));
    group_ = group.get();
    TrainerOptions options;
    options.job_id = "job-1";
    options.spec = std::move(spec);
    options.output_dir = dir_;
    options.files = files_;
    options.clock = clock_.clock();
    options.submitted = clock_.clock()() - absl::Seconds(2);
    options.draining_workers = draining_;
    return std::make_unique<Trainer>(std::move(options), &record_, std::move(group));
  }

  // Every rank's training batches, epoch by epoch, as DistributedSampler deals them.
  static std::vector<testing::TrainedBatch> Expected(const v1::JobSpec& spec, int epochs) {
    std::vector<testing::TrainedBatch> out;
    for (int epoch = 0; epoch < epochs; ++epoch) {
      std::vector<std::vector<std::vector<int64_t>>> ranks;
      for (int r = 0; r < 2; ++r) {
        ranks.push_back(Batches(TrainShard(64, 2, r, true, spec.seed_everything(), epoch),
                                spec.data().batch_size()));
      }
      for (size_t b = 0; b < ranks[0].size(); ++b) {
        for (int r = 0; r < 2; ++r) out.push_back({epoch, r, ranks[r][b]});
      }
    }
    return out;
  }

  // A run of `spec` from scratch (a new record and checkpoint store), for tests that compare
  // runs. The trainer, and so group(), stays until the next.
  absl::Status RunAfresh(const v1::JobSpec& spec, FakeWorkerGroupOptions fake) {
    record_ = Record();
    store_ = FakeCheckpointStore();
    trainer_ = Make(spec, std::move(fake));
    return trainer_->Run();
  }

  FakeWorkerGroup& group() { return *group_; }

  ManualClock clock_;
  Record record_;
  FakeCheckpointStore store_;
  std::vector<v1::JobFile> files_;
  std::function<std::vector<std::string>()> draining_;
  std::string dir_ = absl::StrCat(::testing::TempDir(), "/trainer-test-", getpid());
  FakeWorkerGroup* group_ = nullptr;
  std::unique_ptr<Trainer> trainer_;  // RunAfresh's; destroyed first, as it reports into record_
};

// The model logs `name` in every training batch, per step and per epoch (a batch of 8), with
// the value `value(epoch, rank)`.
inline FakeWorkerGroupOptions LoggedEachBatch(
    const std::string& name, std::function<double(int64_t epoch, int rank)> value) {
  FakeWorkerGroupOptions fake;
  fake.training_logged = [name, value = std::move(value)](
                             int64_t epoch, int64_t,
                             int rank) -> std::map<std::string, LoggedValue> {
    const double v = value(epoch, rank);
    return {
        {name, LoggedValue{
                   .value = v, .local_value = v, .on_step = true, .on_epoch = true, .weight = 8}}};
  };
  return fake;
}

// Every rank's val_loss at the k-th validation of the run is losses[k].
inline FakeWorkerGroupOptions ValidationLosses(std::vector<double> losses) {
  FakeWorkerGroupOptions fake;
  fake.validation_metrics = [losses = std::move(losses)](
                                int validation, int rank) -> std::map<std::string, double> {
    return {{"loss", losses[validation]}};
  };
  return fake;
}

}  // namespace trainer_fixture
}  // namespace dtrain
