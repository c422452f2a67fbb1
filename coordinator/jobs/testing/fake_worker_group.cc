#include "coordinator/jobs/testing/fake_worker_group.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/distributed_sampler.h"
#include "common/status_macros.h"

namespace dtrain::testing {

std::string FakeCheckpointStore::Put(const std::string& name, FakeCheckpoint checkpoint) {
  files_[name] = checkpoint;
  const std::string digest = absl::StrFormat("sha256:%064x", stored_.size() + 1);
  stored_[digest] = checkpoint;
  return digest;
}

const FakeCheckpoint* FakeCheckpointStore::Find(const std::string& path) const {
  if (absl::StartsWith(path, "artifact:")) {
    auto it = stored_.find(path.substr(std::string("artifact:").size()));
    return it == stored_.end() ? nullptr : &it->second;
  }
  const size_t slash = path.rfind('/');
  auto it = files_.find(slash == std::string::npos ? path : path.substr(slash + 1));
  return it == files_.end() ? nullptr : &it->second;
}

std::set<std::string> FakeCheckpointStore::names() const {
  std::set<std::string> out;
  for (const auto& [name, checkpoint] : files_) out.insert(name);
  return out;
}

FakeWorkerGroup::FakeWorkerGroup(FakeWorkerGroupOptions options)
    : options_(std::move(options)),
      store_(options_.store != nullptr ? options_.store : &own_store_),
      weight_(options_.initial_weight) {}

int FakeWorkerGroup::count(const std::string& what) const {
  auto it = counts_.find(what);
  return it == counts_.end() ? 0 : it->second;
}

std::string FakeWorkerGroup::Describe(int worker) const {
  // One rank per worker but in a world of 1, where worker 0 hosts rank 0 alone.
  return worker < world_
             ? absl::StrCat("worker '", options_.workers[worker], "' (rank ", worker, ")")
             : absl::StrCat("worker '", options_.workers[worker], "'");
}

void FakeWorkerGroup::StartTrain(const TrainCall& call) {
  started_.emplace_back(call, !started_.empty());
}

absl::StatusOr<TrainResult> FakeWorkerGroup::FinishTrain() {
  if (started_.empty()) return absl::InternalError("FinishTrain without a started call");
  auto [call, pipelined] = std::move(started_.front());
  started_.pop_front();
  absl::StatusOr<TrainResult> result = Train(call);
  for (auto it = calls_.rbegin(); it != calls_.rend(); ++it) {
    if (it->what != "training_step") continue;
    it->pipelined = pipelined;
    break;
  }
  if (!result.ok()) AbandonTrain();  // as the gRPC group: what follows a failed call never runs
  return result;
}

void FakeWorkerGroup::AbandonTrain() {
  abandoned_ += static_cast<int>(started_.size());
  started_.clear();
}

absl::Status FakeWorkerGroup::Begin(const std::string& what, int64_t batches) {
  FakeCall call{what, counts_[what]++, batches};
  calls_.push_back(call);
  if (what != "training_step" && !started_.empty()) {
    return absl::InternalError(absl::StrCat(what, " came while a training call was unfinished"));
  }
  absl::Status hooked = options_.before_call ? options_.before_call(call) : absl::OkStatus();
  absl::MutexLock lock(&mu_);
  if (cancelled_) return absl::CancelledError("the job was cancelled");
  // A worker the registry lost is the root cause of whatever failed with it.
  if (!lost_.empty()) {
    const auto& [name, why] = *lost_.begin();
    const auto it = std::find(options_.workers.begin(), options_.workers.end(), name);
    return WorkerLostError(what, Describe(static_cast<int>(it - options_.workers.begin())), why);
  }
  if (!hooked.ok()) {
    return absl::Status(hooked.code(),
                        absl::StrCat(what, " failed on ", Describe(0), ": ", hooked.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<GroupSetup> FakeWorkerGroup::Setup(const v1::JobSpec& spec,
                                                  const SetupContext& context,
                                                  bool clear_stale_runs) {
  spec_ = spec;
  context_ = context;
  world_ = context.world_size;
  DTRAIN_RETURN_IF_ERROR(Begin("setup"));
  if (world_ < 1 || world_ > size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the fake hosts one rank per worker: ", world_, " ranks on ", size()));
  }
  GroupSetup setup;
  setup.world_size = world_;
  setup.split_sizes = options_.splits;
  if (world_ > 1) setup.collective_plane = "fake";
  setup.sampled_work = options_.sampled_work;
  setup.other_deals = options_.other_deals;
  for (int i = 0; i < size(); ++i) setup.workers.push_back(Describe(i));
  for (int r = 0; r < world_; ++r) {
    setup.ranks.push_back(
        absl::StrCat("rank ", r, " on '", options_.workers[r], "' (node ", r, ", local 0)"));
  }
  return setup;
}

std::map<std::string, double> FakeWorkerGroup::Measure(const std::vector<int64_t>& indices) const {
  double loss = 0;
  double close = 0;
  for (int64_t i : indices) {
    const double d = weight_ - Target(i);
    loss += d * d;
    if (std::abs(d) < 0.15) close += 1;
  }
  const double n = static_cast<double>(std::max<size_t>(indices.size(), 1));
  return {{"loss", loss / n}, {"acc", close / n}};
}

namespace {

// torch.optim's class name after "lr-", as a worker names the rate (a spec without an optimizer
// trains with SGD).
std::string RateName(const std::string& optimizer) {
  if (optimizer == "adam") return "lr-Adam";
  if (optimizer == "adamw") return "lr-AdamW";
  return "lr-SGD";
}

}  // namespace

absl::StatusOr<TrainResult> FakeWorkerGroup::Train(const TrainCall& call) {
  DTRAIN_RETURN_IF_ERROR(Begin("training_step", call.count));
  calls_.back().first = call.first;
  calls_.back().listed = call.batches != nullptr;
  // Dealt as a worker deals them (worker/runtime/sampled_epoch.cc), when the fake says it does.
  RankBatches dealt;
  if (call.batches == nullptr) {
    if (!options_.sampled_work) return absl::InternalError("a training call without its batches");
    dealt = EveryRankTrainBatches(call.sampling.samples, world_, /*streamed=*/false,
                                  call.sampling.shuffle, call.sampling.seed, call.epoch,
                                  static_cast<int>(call.sampling.batch_size));
  }
  const RankBatches& batches = call.batches != nullptr ? *call.batches : dealt;
  const int64_t accumulate = std::max(1, spec_.trainer().accumulate_grad_batches());
  const double lr = spec_.optimizer().lr();
  TrainResult result;
  result.ranks.resize(world_);
  for (int r = 0; r < world_; ++r) result.ranks[r].rank = r;
  for (int64_t b = call.first; b < call.first + call.count; ++b) {
    // Every rank's gradient of its own batch, averaged in rank order (an all_reduce).
    double gradient = 0;
    for (int r = 0; r < world_; ++r) {
      const std::vector<int64_t>& indices = batches[r][b];
      trained_.push_back({call.epoch, r, indices});
      double g = 0;
      for (int64_t i : indices) g += 2 * (weight_ - Target(i));
      g /= static_cast<double>(std::max<size_t>(indices.size(), 1));
      gradient += g;
      BatchScalars scalars;
      scalars.size = static_cast<int64_t>(indices.size());
      scalars.scalars = {{"loss", Measure(indices).at("loss")}};
      if (options_.training_logged) scalars.logged = options_.training_logged(call.epoch, b, r);
      result.ranks[r].batches.push_back(std::move(scalars));
    }
    gradient_ += gradient / world_ / static_cast<double>(accumulate);
    ++accumulated_;
    const bool closes =
        accumulated_ == accumulate || (call.end_of_epoch && b == call.first + call.count - 1);
    for (int r = 0; r < world_; ++r) {
      BatchScalars& last = result.ranks[r].batches.back();
      last.optimizer_stepped = closes;
      // As a real worker reports the rate each step used, under LearningRateMonitor's name.
      if (closes) last.learning_rates[RateName(spec_.optimizer().name())] = lr;
    }
    if (closes) {
      weight_ -= lr * gradient_;
      gradient_ = 0;
      accumulated_ = 0;
      ++global_step_;
    }
  }
  for (RankTrainResult& rank : result.ranks) {
    rank.global_step = global_step_;
    rank.step_seconds = 0.01 * static_cast<double>(call.count);
    rank.gradient_wait_seconds = 0.001 * static_cast<double>(call.count) * rank.rank;
    // A core shared with other work: rank 1 waits 1 ms a batch for it (10%), rank 0 never.
    rank.core_wait_seconds = rank.rank == 1 ? 0.001 * static_cast<double>(call.count) : 0.0;
    // Per batch: data 1 ms, forward 3, averaging 1 plus the rank's wait above, backward what
    // is left of 3 after that wait, optimizer 1: the rest of the 10 ms (1 ms for ranks 0-3)
    // is bookkeeping.
    const double n = static_cast<double>(call.count), wait = 0.001 * rank.rank;
    rank.phases = {0.001 * n, 0.003 * n, std::max(0.0, 0.003 - wait) * n, (0.001 + wait) * n,
                   0.001 * n};
  }
  return result;
}

absl::StatusOr<EvalResult> FakeWorkerGroup::Evaluate(EvalKind kind, const RankBatches& batches) {
  const bool test = kind == EvalKind::kTest;
  const bool sanity = kind == EvalKind::kSanity;
  DTRAIN_RETURN_IF_ERROR(Begin(test ? "test_step" : sanity ? "sanity_check" : "validation_step"));
  const int validation = test ? -1 : sanity ? 0 : validations_++;
  EvalResult result;
  result.ranks.resize(world_);
  int64_t most = 0;
  for (const auto& mine : batches) most = std::max<int64_t>(most, mine.size());
  evaluated_.push_back(most);
  for (int r = 0; r < world_ && r < static_cast<int>(batches.size()); ++r) {
    for (const std::vector<int64_t>& indices : batches[r]) {
      BatchScalars scalars;
      scalars.size = static_cast<int64_t>(indices.size());
      scalars.scalars = !test && options_.validation_metrics
                            ? options_.validation_metrics(validation, r)
                            : Measure(indices);
      result.ranks[r].push_back(std::move(scalars));
    }
  }
  return result;
}

absl::StatusOr<PredictResult> FakeWorkerGroup::Predict(const PredictCall& call) {
  DTRAIN_RETURN_IF_ERROR(Begin("predict_step"));
  PredictResult result;
  result.ranks.resize(world_);
  for (int r = 0; r < world_; ++r) {
    const auto& mine = (*call.batches)[r];
    for (int64_t b = call.first;
         b < call.first + call.count && b < static_cast<int64_t>(mine.size()); ++b) {
      const std::vector<int64_t>& indices = mine[b];
      const int64_t n = static_cast<int64_t>(indices.size());
      std::vector<int64_t> labels(n);
      std::vector<float> scores(n);
      for (int64_t k = 0; k < n; ++k) {
        labels[k] = indices[k] % 10;
        scores[k] = static_cast<float>(weight_ - Target(indices[k]));
      }
      std::map<std::string, HostTensor>& outputs = result.ranks[r].emplace_back().outputs;
      outputs["label"] = HostTensor::FromVector(v1::DTYPE_INT64, {n}, labels);
      outputs["score"] = HostTensor::FromVector(v1::DTYPE_FLOAT32, {n}, scores);
      outputs["logits"] =
          HostTensor::FromVector(v1::DTYPE_FLOAT32, {n, 2}, std::vector<float>(2 * n, 0.5f));
    }
  }
  return result;
}

absl::StatusOr<SavedCheckpoint> FakeWorkerGroup::Save(const SaveCall& call) {
  DTRAIN_RETURN_IF_ERROR(Begin("save_checkpoint"));
  const std::string digest =
      store_->Put(call.name, {weight_, global_step_, call.epoch, call.total_steps});
  for (const std::string& name : call.remove) store_->Remove(name);
  SavedCheckpoint saved;
  saved.written = true;
  // Sent to the coordinator's store unless the job names a shared directory.
  if (spec_.checkpoint().dirpath().empty()) saved.digest = digest;
  saved.bytes = 8;
  return saved;
}

absl::StatusOr<LoadedCheckpoint> FakeWorkerGroup::Load(const std::string& path) {
  DTRAIN_RETURN_IF_ERROR(Begin("load_checkpoint"));
  const FakeCheckpoint* found = store_->Find(path);
  if (found == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("load_checkpoint failed on ", Describe(0), ": no checkpoint '", path, "'"));
  }
  weight_ = found->weight;
  global_step_ = found->global_step;
  gradient_ = 0;
  accumulated_ = 0;
  return LoadedCheckpoint{found->global_step, found->epoch};
}

absl::StatusOr<bool> FakeWorkerGroup::AnyRankDecides(const std::vector<bool>& by_rank) {
  DTRAIN_RETURN_IF_ERROR(Begin("reduce_boolean_decision"));
  return std::any_of(by_rank.begin(), by_rank.end(), [](bool b) { return b; });
}

void FakeWorkerGroup::Teardown() { torn_down_ = true; }

void FakeWorkerGroup::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
}

bool FakeWorkerGroup::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

void FakeWorkerGroup::MarkLost(const std::string& worker, const std::string& why) {
  if (std::find(options_.workers.begin(), options_.workers.end(), worker) ==
      options_.workers.end()) {
    return;
  }
  absl::MutexLock lock(&mu_);
  lost_.emplace(worker, why);
}

std::vector<std::string> FakeWorkerGroup::unreachable() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const auto& [name, why] : lost_) out.push_back(name);
  return out;
}

std::vector<std::string> FakeWorkerGroup::lost() const { return unreachable(); }

}  // namespace dtrain::testing
