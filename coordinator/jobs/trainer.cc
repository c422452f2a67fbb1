#include "coordinator/jobs/trainer.h"

#include <algorithm>
#include <filesystem>
#include <functional>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/channel.h"
#include "common/grpc_status.h"
#include "common/job_spec.h"
#include "common/status_macros.h"
#include "common/tensor.h"
#include "coordinator/jobs/distributed_sampler.h"

namespace dtrain {
namespace {

constexpr int64_t kFashionMnistTrainImages = 60000;
constexpr int64_t kDefaultValSize = 5000;

bool IsDistributedStrategy(const std::string& strategy) {
  return strategy == "ddp" || strategy == "ddp_spawn" || strategy == "sharded";
}

// Training samples the spec implies, when it can be known before the workers load the data.
int64_t KnownTrainSize(const v1::JobSpec& spec) {
  const v1::DataConfig& d = spec.data();
  int64_t n = -1;
  if (d.has_synthetic()) n = d.synthetic().train_size();
  if (d.source_case() == v1::DataConfig::kBuiltin) {
    n = kFashionMnistTrainImages - (d.val_size() > 0 ? d.val_size() : kDefaultValSize);
  }
  if (n >= 0 && d.limit_train_samples() > 0) n = std::min(n, d.limit_train_samples());
  return n;
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

Trainer::Trainer(TrainerOptions options, TrainerReporter* reporter)
    : options_(std::move(options)), reporter_(reporter) {
  for (const v1::WorkerInfo& w : options_.workers) {
    stubs_.push_back(v1::Worker::NewStub(ConnectToCoordinator(w.address())));
  }
}

void Trainer::Cancel() {
  cancelled_ = true;
  calls_.CancelAll();
}

std::string Trainer::DescribeWorker(int worker) const {
  std::string ranks;
  if (worker < static_cast<int>(ranks_of_worker_.size()) && !ranks_of_worker_[worker].empty()) {
    ranks = absl::StrCat(ranks_of_worker_[worker].size() == 1 ? " (rank " : " (ranks ",
                         absl::StrJoin(ranks_of_worker_[worker], ", "), ")");
  }
  return absl::StrCat("worker '", options_.workers[worker].name(), "'", ranks);
}

std::vector<std::string> Trainer::OtherCheckpoints(const std::string& path) {
  // The coordinator sees the directory on the local cluster's shared file system; elsewhere
  // the list is empty and the original error stands.
  std::vector<std::pair<std::filesystem::file_time_type, std::string>> found;
  std::error_code error;
  const std::filesystem::path target(path);
  for (const auto& entry : std::filesystem::directory_iterator(target.parent_path(), error)) {
    if (entry.path().extension() != ".ckpt" || entry.path() == target) continue;
    found.emplace_back(entry.last_write_time(error), entry.path().string());
  }
  std::sort(found.begin(), found.end(), std::greater<>());
  std::vector<std::string> out;
  for (auto& [time, name] : found) out.push_back(std::move(name));
  return out;
}

void Trainer::NoteUnreachable(const std::vector<grpc::Status>& results) {
  for (size_t i = 0; i < results.size(); ++i) {
    if (results[i].error_code() == grpc::StatusCode::UNAVAILABLE)
      unreachable_.insert(static_cast<int>(i));
  }
}

std::vector<std::string> Trainer::unreachable_workers() const {
  std::vector<std::string> names;
  for (int i : unreachable_) names.push_back(options_.workers[i].name());
  return names;
}

absl::Status Trainer::OnEveryWorker(
    const std::string& what, const std::function<grpc::Status(int, grpc::ClientContext*)>& call,
    absl::Duration timeout) {
  if (cancelled_) return absl::CancelledError("the job was cancelled");
  const std::vector<grpc::Status> results =
      calls_.Run(static_cast<int>(stubs_.size()), call, kFailureGrace, absl::Now() + timeout);
  NoteUnreachable(results);
  if (cancelled_) return absl::CancelledError("the job was cancelled");
  // The root cause first: a call the trainer cancelled after another failed is secondary.
  for (const bool skip_cancelled : {true, false}) {
    for (size_t i = 0; i < results.size(); ++i) {
      if (results[i].ok()) continue;
      if (skip_cancelled && results[i].error_code() == grpc::StatusCode::CANCELLED) continue;
      absl::Status s = FromGrpcStatus(results[i]);
      if (s.code() == absl::StatusCode::kUnavailable) {
        return absl::UnavailableError(absl::StrCat(
            what, " lost ", DescribeWorker(i), " (", s.message(),
            "): it was stopped, its process died or its host became unreachable; see that "
            "worker's log"));
      }
      return absl::Status(s.code(),
                          absl::StrCat(what, " failed on ", DescribeWorker(i), ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status Trainer::Setup() {
  const v1::JobSpec& spec = options_.spec;
  const v1::TrainerConfig& t = spec.trainer();
  const bool distributed = IsDistributedStrategy(t.strategy());
  world_ = distributed ? static_cast<int>(options_.workers.size()) * RanksPerWorker(spec) : 1;

  v1::SetupRequest request;
  request.set_job_id(options_.job_id);
  *request.mutable_model() = spec.model();
  *request.mutable_optimizer() = spec.optimizer();
  *request.mutable_lr_scheduler() = spec.lr_scheduler();
  request.set_precision(t.precision());
  request.set_strategy(t.strategy());
  request.set_accelerator(t.accelerator());
  request.set_devices(t.devices());
  request.set_seed(t.seed());
  request.set_accumulate_grad_batches(t.accumulate_grad_batches());
  request.set_gradient_clip_val(t.gradient_clip_val());
  request.set_gradient_clip_algorithm(t.gradient_clip_algorithm());
  request.set_bucket_bytes(static_cast<int64_t>(t.bucket_cap_mb() * (1 << 20)));
  v1::GroupSpec* group = request.mutable_group();
  group->set_coordinator(options_.coordinator);
  group->set_group(options_.group.empty() ? options_.job_id : options_.group);
  group->set_token(options_.job_token);
  group->set_world_size(world_);
  group->set_collective_timeout_ms(t.collective_timeout_ms());
  group->set_register_timeout_ms(absl::ToInt64Milliseconds(options_.setup_timeout));
  group->set_backend(t.collective_backend());
  v1::DataSpec* data = request.mutable_data();
  const v1::DataConfig& d = spec.data();
  if (d.source_case() == v1::DataConfig::kBuiltin) data->set_builtin(d.builtin());
  if (d.has_synthetic()) *data->mutable_synthetic() = d.synthetic();
  if (d.source_case() == v1::DataConfig::kTensorsFile) data->set_tensors_file(d.tensors_file());
  data->set_data_dir(d.data_dir());
  data->set_val_size(d.val_size());

  // The schedule's length is the run's, unless the spec says otherwise.
  const int64_t known = KnownTrainSize(spec);
  if (known >= 0) {
    batches_per_epoch_ = CeilDiv(CeilDiv(known, world_), d.batch_size());
    total_steps_ = CeilDiv(batches_per_epoch_, t.accumulate_grad_batches()) * t.max_epochs();
    if (t.max_steps() > 0) total_steps_ = std::min(total_steps_, t.max_steps());
  }
  if (spec.lr_scheduler().name() == "cosine" && spec.lr_scheduler().total_steps() == 0) {
    if (total_steps_ <= 0) {
      return absl::InvalidArgumentError(
          "lr_scheduler.total_steps: a cosine schedule over a tensors_file dataset needs it");
    }
    request.mutable_lr_scheduler()->set_total_steps(total_steps_);
  }

  const int n = static_cast<int>(stubs_.size());
  if (options_.clear_stale_runs) {
    // Teardown of this job id is a no-op on a worker that does not hold it.
    DTRAIN_RETURN_IF_ERROR(OnEveryWorker(
        "teardown of the run before the coordinator restarted",
        [&](int i, grpc::ClientContext* context) {
          v1::TeardownRequest stale;
          stale.set_job_id(options_.job_id);
          v1::TeardownResponse response;
          return stubs_[i]->Teardown(context, stale, &response);
        },
        kTeardownTimeout));
  }
  std::vector<v1::SetupResponse> responses(n);
  reporter_->Log(absl::StrCat("setting up ", n, " worker(s) for ", world_, " rank(s), strategy ",
                              t.strategy()));
  DTRAIN_RETURN_IF_ERROR(OnEveryWorker(
      "setup",
      [&](int i, grpc::ClientContext* context) {
        return stubs_[i]->Setup(context, request, &responses[i]);
      },
      options_.setup_timeout + absl::Seconds(30)));
  ranks_of_worker_.assign(n, {});
  placement_.assign(world_, Placement{});
  std::vector<std::string> where(world_);  // by rank, for the log
  std::vector<bool> seen(world_, false);
  for (int i = 0; i < n; ++i) {
    for (int local = 0; local < responses[i].ranks_size(); ++local) {
      const v1::RankInfo& r = responses[i].ranks(local);
      if (r.rank() < 0 || r.rank() >= world_ || seen[r.rank()] || r.world_size() != world_) {
        return absl::InternalError(absl::StrCat(DescribeWorker(i), " reported rank ", r.rank(),
                                                " of ", r.world_size(), "; expected a world of ",
                                                world_));
      }
      seen[r.rank()] = true;
      ranks_of_worker_[i].push_back(r.rank());
      placement_[r.rank()] = Placement{i, local};
      where[r.rank()] = absl::StrCat("rank ", r.rank(), " on '", options_.workers[i].name(),
                                     "' (node ", r.node_rank(), ", local ", r.local_rank(), ")");
    }
  }
  for (const v1::SplitInfo& s : responses[0].splits()) split_sizes_[s.name()] = s.size();
  if (split_sizes_["train"] <= 0)
    return absl::InvalidArgumentError("data: the train split is empty");
  int64_t n_train = split_sizes_["train"];
  if (d.limit_train_samples() > 0) n_train = std::min(n_train, d.limit_train_samples());
  split_sizes_["train"] = n_train;
  batches_per_epoch_ = CeilDiv(CeilDiv(n_train, world_), d.batch_size());
  // Each epoch's last batch closes its accumulation window (as Lightning steps at epoch end).
  total_steps_ = CeilDiv(batches_per_epoch_, t.accumulate_grad_batches()) * t.max_epochs();
  if (t.max_steps() > 0) total_steps_ = std::min(total_steps_, t.max_steps());
  early_stop_.assign(world_, EarlyStopState{});
  std::vector<std::string> names;
  for (int i = 0; i < n; ++i) names.push_back(DescribeWorker(i));
  reporter_->Log(absl::StrCat("group formed: ", absl::StrJoin(names, ", "), "; ", n_train,
                              " training samples, ", batches_per_epoch_,
                              " batches per rank per epoch, ", total_steps_, " optimizer steps"));
  constexpr int kLoggedRanks = 64;
  if (static_cast<int>(where.size()) > kLoggedRanks) {
    const size_t more = where.size() - kLoggedRanks;
    where.resize(kLoggedRanks);
    where.push_back(absl::StrCat("and ", more, " more"));
  }
  reporter_->Log(absl::StrCat("ranks: ", absl::StrJoin(where, ", ")));
  return absl::OkStatus();
}

void Trainer::Report() {
  progress_.set_global_step(global_step_);
  progress_.set_total_steps(total_steps_);
  progress_.set_batches_per_epoch(batches_per_epoch_);
  progress_.set_max_epochs(options_.spec.trainer().max_epochs());
  progress_.set_train_loss(last_loss_);
  const double seconds = absl::ToDoubleSeconds(absl::Now() - fit_start_);
  if (seconds > 0 && samples_done_ > 0) {
    progress_.set_samples_per_second(samples_done_ / seconds);
  }
  if (global_step_ > 0 && total_steps_ > global_step_) {
    progress_.set_eta_seconds(seconds / global_step_ * (total_steps_ - global_step_));
  } else {
    progress_.set_eta_seconds(0);
  }
  reporter_->Progress(progress_);
}

absl::Status Trainer::TrainEpoch(int64_t epoch, int64_t start_batch, bool* stop) {
  const v1::JobSpec& spec = options_.spec;
  const v1::TrainerConfig& t = spec.trainer();
  std::vector<std::vector<std::vector<int64_t>>> batches(world_);
  for (int r = 0; r < world_; ++r) {
    batches[r] = Batches(
        TrainShard(split_sizes_["train"], world_, r, spec.data().shuffle(), t.seed(), epoch),
        spec.data().batch_size());
  }
  const int64_t nb = batches_per_epoch_;
  const double vci = t.val_check_interval();
  const int64_t interval =
      vci <= 1 ? std::max<int64_t>(1, std::llround(vci * nb)) : static_cast<int64_t>(vci);
  progress_.set_epoch(epoch);
  progress_.set_phase("train");
  int64_t b = start_batch;
  while (b < nb) {
    if (cancelled_) return absl::CancelledError("the job was cancelled");
    // A stopping worker is let go at an optimizer-step boundary (no half-accumulated
    // gradients are lost), after a checkpoint every rank writes, so the job resumes exactly here.
    if (b % t.accumulate_grad_batches() == 0 && options_.draining_workers) {
      std::vector<std::string> draining = options_.draining_workers();
      if (!draining.empty()) return LetDrainingWorkersGo(std::move(draining), epoch);
    }
    int64_t next_val = (b / interval + 1) * interval;
    if (vci <= 1) next_val = std::min(next_val, nb);
    int64_t chunk = std::min<int64_t>({t.batches_per_call(), nb - b, next_val - b});
    if (t.max_steps() > 0) {
      // Batches until the max_steps-th optimizer step; windows restart at each epoch.
      const int64_t left = (t.max_steps() - global_step_) * t.accumulate_grad_batches() -
                           b % t.accumulate_grad_batches();
      if (left <= 0) {
        *stop = true;
        return absl::OkStatus();
      }
      chunk = std::min(chunk, left);
    }
    const int n = static_cast<int>(stubs_.size());
    std::vector<v1::StepRequest> requests(n);
    std::vector<v1::StepResponse> responses(n);
    for (int i = 0; i < n; ++i) {
      requests[i].set_job_id(options_.job_id);
      requests[i].set_epoch(epoch);
      requests[i].set_end_of_epoch(b + chunk == nb);
      for (int rank : ranks_of_worker_[i]) {
        v1::LocalWork* work = requests[i].add_work();
        work->set_first_batch_idx(b);
        for (int64_t k = b; k < b + chunk; ++k) {
          v1::IndexBatch* batch = work->add_index_batches();
          batch->set_split("train");
          batch->mutable_indices()->Add(batches[rank][k].begin(), batches[rank][k].end());
        }
      }
    }
    DTRAIN_RETURN_IF_ERROR(OnEveryWorker(
        "training_step",
        [&](int i, grpc::ClientContext* context) {
          return stubs_[i]->TrainingStep(context, requests[i], &responses[i]);
        },
        options_.step_timeout));
    double loss_sum = 0;
    int64_t loss_count = 0;
    const int64_t step_before = global_step_;
    for (const v1::StepResponse& response : responses) {
      for (const v1::LocalResult& result : response.results()) {
        global_step_ = result.global_step();
        for (const v1::BatchResult& batch : result.batches()) {
          loss_sum += batch.scalars().at("loss");
          ++loss_count;
          samples_done_ += batch.size();
        }
      }
    }
    last_loss_ = loss_count > 0 ? loss_sum / loss_count : 0;
    b += chunk;
    progress_.set_batch_in_epoch(b);
    const int64_t every = t.log_every_n_steps();
    if (global_step_ / every != step_before / every || b == nb) {
      reporter_->Metric("train_loss", last_loss_, global_step_, epoch);
    }
    Report();
    const int64_t ckpt_every = spec.checkpoint().every_n_steps();
    if (ckpt_every > 0 && global_step_ / ckpt_every != step_before / ckpt_every) {
      DTRAIN_RETURN_IF_ERROR(SaveCheckpoint(options_.checkpoint_dir + "/last.ckpt", epoch));
    }
    if (b == next_val) {
      DTRAIN_RETURN_IF_ERROR(ValidateAndMaybeStop(epoch, stop));
      if (*stop) return absl::OkStatus();
      progress_.set_phase("train");
    }
    if (t.max_steps() > 0 && global_step_ >= t.max_steps()) {
      *stop = true;
      return absl::OkStatus();
    }
  }
  return absl::OkStatus();
}

void Trainer::EvalRequests(const std::string& split, int64_t limit_samples, int64_t limit_batches,
                           std::vector<v1::StepRequest>* requests,
                           std::vector<std::vector<std::vector<int64_t>>>* shards) const {
  int64_t size = split_sizes_.at(split);
  if (limit_samples > 0) size = std::min(size, limit_samples);
  requests->assign(stubs_.size(), v1::StepRequest());
  if (shards != nullptr) shards->assign(world_, {});
  for (size_t i = 0; i < stubs_.size(); ++i) {
    (*requests)[i].set_job_id(options_.job_id);
    for (int rank : ranks_of_worker_[i]) {
      v1::LocalWork* work = (*requests)[i].add_work();
      auto shard = Batches(EvalShard(size, world_, rank), options_.spec.data().eval_batch_size());
      if (limit_batches > 0 && static_cast<int64_t>(shard.size()) > limit_batches) {
        shard.resize(limit_batches);
      }
      for (const std::vector<int64_t>& indices : shard) {
        v1::IndexBatch* batch = work->add_index_batches();
        batch->set_split(split);
        batch->mutable_indices()->Add(indices.begin(), indices.end());
      }
      if (shards != nullptr) (*shards)[rank] = std::move(shard);
    }
  }
}

absl::Status Trainer::Evaluate(const std::string& split, int64_t limit_samples, bool test,
                               std::map<std::string, double>* overall,
                               std::vector<std::map<std::string, double>>* per_rank) {
  const int n = static_cast<int>(stubs_.size());
  std::vector<v1::StepRequest> requests;
  std::vector<v1::StepResponse> responses(n);
  EvalRequests(split, limit_samples, test ? 0 : options_.spec.trainer().limit_val_batches(),
               &requests, nullptr);
  DTRAIN_RETURN_IF_ERROR(OnEveryWorker(
      test ? "test_step" : "validation_step",
      [&](int i, grpc::ClientContext* context) {
        return test ? stubs_[i]->TestStep(context, requests[i], &responses[i])
                    : stubs_[i]->ValidationStep(context, requests[i], &responses[i]);
      },
      options_.step_timeout));
  // Sample-weighted means: every sample counts once, whichever rank saw it.
  const std::string prefix = test ? "test_" : "val_";
  std::map<std::string, std::pair<double, int64_t>> sums;
  per_rank->assign(world_, {});
  for (int i = 0; i < n; ++i) {
    for (int local = 0; local < responses[i].results_size(); ++local) {
      const int rank = ranks_of_worker_[i][local];
      std::map<std::string, std::pair<double, int64_t>> mine;
      for (const v1::BatchResult& batch : responses[i].results(local).batches()) {
        for (const auto& [name, value] : batch.scalars()) {
          sums[prefix + name].first += value * batch.size();
          sums[prefix + name].second += batch.size();
          mine[prefix + name].first += value * batch.size();
          mine[prefix + name].second += batch.size();
        }
      }
      for (const auto& [name, sum] : mine) (*per_rank)[rank][name] = sum.first / sum.second;
    }
  }
  overall->clear();
  for (const auto& [name, sum] : sums) (*overall)[name] = sum.first / sum.second;
  return absl::OkStatus();
}

absl::Status Trainer::SaveCheckpoint(const std::string& path, int64_t epoch) {
  const std::string previous_phase = progress_.phase();
  progress_.set_phase("checkpoint");
  Report();
  v1::SaveCheckpointRequest request;
  request.set_job_id(options_.job_id);
  request.set_path(path);
  request.set_epoch(epoch);
  const int n = static_cast<int>(stubs_.size());
  std::vector<v1::SaveCheckpointResponse> responses(n);
  DTRAIN_RETURN_IF_ERROR(OnEveryWorker(
      "save_checkpoint",
      [&](int i, grpc::ClientContext* context) {
        return stubs_[i]->SaveCheckpoint(context, request, &responses[i]);
      },
      options_.step_timeout));
  last_checkpoint_ = path;
  progress_.set_phase(previous_phase);
  reporter_->Log(absl::StrCat("checkpoint written: ", path, " (step ", global_step_, ")"));
  reporter_->Checkpoint(last_checkpoint_, top_k_.empty() ? "" : top_k_.front().second);
  return absl::OkStatus();
}

absl::Status Trainer::LetDrainingWorkersGo(std::vector<std::string> names, int64_t epoch) {
  std::vector<std::string> quoted;
  for (const std::string& name : names) quoted.push_back(absl::StrCat("'", name, "'"));
  reporter_->Log(absl::StrCat("worker(s) ", absl::StrJoin(quoted, ", "),
                              " are stopping: checkpointing at step ", global_step_,
                              " to let them go"));
  DTRAIN_RETURN_IF_ERROR(SaveCheckpoint(options_.checkpoint_dir + "/last.ckpt", epoch));
  drained_ = std::move(names);
  return absl::UnavailableError(absl::StrCat("worker(s) ", absl::StrJoin(quoted, ", "),
                                             " stopped (drained); checkpointed at step ",
                                             global_step_));
}

absl::Status Trainer::ValidateAndMaybeStop(int64_t epoch, bool* stop) {
  const v1::JobSpec& spec = options_.spec;
  if (split_sizes_.count("val") == 0 || split_sizes_["val"] == 0) return absl::OkStatus();
  std::map<std::string, double> overall;
  std::vector<std::map<std::string, double>> per_rank;
  DTRAIN_RETURN_IF_ERROR(EvaluateAndReport("val", /*test=*/false, &overall, &per_rank));
  auto metric = [&](const std::string& monitor,
                    const std::string& section) -> absl::StatusOr<double> {
    auto it = overall.find(monitor);
    if (it == overall.end()) {
      std::vector<std::string> have;
      for (const auto& [name, value] : overall) have.push_back(name);
      return absl::FailedPreconditionError(absl::StrCat(
          section, ".monitor: '", monitor, "' is not a validation metric; the model reports ",
          absl::StrJoin(have, ", ")));
    }
    return it->second;
  };

  // Checkpoints: the top k by the monitored metric, or simply the latest.
  const v1::CheckpointConfig& c = spec.checkpoint();
  if (c.monitor().empty()) {
    DTRAIN_RETURN_IF_ERROR(SaveCheckpoint(options_.checkpoint_dir + "/last.ckpt", epoch));
  } else {
    DTRAIN_ASSIGN_OR_RETURN(double value, metric(c.monitor(), "checkpoint"));
    const bool higher = c.mode() == "max";
    auto better = [&](double a, double b) { return higher ? a > b : a < b; };
    const bool qualifies =
        static_cast<int>(top_k_.size()) < c.save_top_k() || better(value, top_k_.back().first);
    if (qualifies) {
      const std::string path =
          absl::StrCat(options_.checkpoint_dir, "/epoch=", epoch, "-step=", global_step_, ".ckpt");
      top_k_.emplace_back(value, path);
      std::stable_sort(top_k_.begin(), top_k_.end(),
                       [&](const auto& a, const auto& b) { return better(a.first, b.first); });
      DTRAIN_RETURN_IF_ERROR(SaveCheckpoint(path, epoch));
      while (static_cast<int>(top_k_.size()) > c.save_top_k()) {
        // Rank 0 wrote it; the coordinator shares its file system in the local cluster and
        // removes it (elsewhere the stale file stays, named in the log).
        if (std::remove(top_k_.back().second.c_str()) != 0) {
          reporter_->Log(
              absl::StrCat("could not remove ", top_k_.back().second, " (not on this machine?)"));
        }
        top_k_.pop_back();
      }
      reporter_->Checkpoint(last_checkpoint_, top_k_.front().second);
    }
  }

  // Early stopping as Lightning's callback does it: each rank judges its own metric, then the
  // ranks agree through reduce_boolean_decision (any rank may stop them all).
  const v1::EarlyStoppingConfig& e = spec.early_stopping();
  if (e.monitor().empty()) return absl::OkStatus();
  DTRAIN_RETURN_IF_ERROR(metric(e.monitor(), "early_stopping").status());
  std::vector<bool> local_stop(world_, false);
  for (int r = 0; r < world_; ++r) {
    auto it = per_rank[r].find(e.monitor());
    if (it == per_rank[r].end()) continue;  // a rank without validation data has no opinion
    EarlyStopState& s = early_stop_[r];
    const bool improved = !s.has_best || (e.mode() == "max" ? it->second > s.best + e.min_delta()
                                                            : it->second < s.best - e.min_delta());
    if (improved) {
      s.best = it->second;
      s.has_best = true;
      s.wait = 0;
    } else {
      ++s.wait;
    }
    local_stop[r] = s.wait >= e.patience();
  }
  const int n = static_cast<int>(stubs_.size());
  std::vector<v1::DecisionResponse> decisions(n);
  DTRAIN_RETURN_IF_ERROR(OnEveryWorker(
      "reduce_boolean_decision",
      [&](int i, grpc::ClientContext* context) {
        v1::DecisionRequest request;
        request.set_job_id(options_.job_id);
        request.set_all(false);
        for (int rank : ranks_of_worker_[i]) request.add_decisions(local_stop[rank]);
        return stubs_[i]->ReduceBooleanDecision(context, request, &decisions[i]);
      },
      options_.step_timeout));
  if (decisions[0].decision()) {
    reporter_->Log(absl::StrCat("early stopping: ", e.monitor(), " did not improve by ",
                                e.min_delta(), " for ", e.patience(), " validations"));
    *stop = true;
  }
  return absl::OkStatus();
}

absl::Status Trainer::EvaluateAndReport(const std::string& split, bool test,
                                        std::map<std::string, double>* overall,
                                        std::vector<std::map<std::string, double>>* per_rank) {
  if (split_sizes_[split] <= 0) {
    if (options_.spec.stage() == "fit") return absl::OkStatus();  // nothing to evaluate
    return absl::FailedPreconditionError(
        absl::StrCat("data: the dataset has no ", split, " split"));
  }
  progress_.set_phase(test ? "test" : "validate");
  Report();
  const v1::DataConfig& d = options_.spec.data();
  DTRAIN_RETURN_IF_ERROR(Evaluate(split, test ? d.limit_test_samples() : d.limit_val_samples(),
                                  test, overall, per_rank));
  std::vector<std::string> parts;
  for (const auto& [name, value] : *overall) {
    reporter_->Metric(name, value, global_step_, progress_.epoch());
    parts.push_back(absl::StrCat(name, "=", absl::SixDigits(value)));
  }
  reporter_->Log(test ? absl::StrCat("test: ", absl::StrJoin(parts, " "))
                      : absl::StrCat("validation at epoch ", progress_.epoch(), " step ",
                                     global_step_, ": ", absl::StrJoin(parts, " ")));
  return absl::OkStatus();
}

absl::Status Trainer::Predict() {
  const v1::JobSpec& spec = options_.spec;
  if (split_sizes_["test"] <= 0) {
    return absl::FailedPreconditionError("data: predict runs over the test split, which is empty");
  }
  progress_.set_phase("predict");
  Report();
  const int n = static_cast<int>(stubs_.size());
  std::vector<v1::StepRequest> requests;
  std::vector<v1::StepResponse> responses(n);
  std::vector<std::vector<std::vector<int64_t>>> shards;
  EvalRequests("test", spec.data().limit_test_samples(), 0, &requests, &shards);
  for (v1::StepRequest& request : requests) request.set_return_outputs(true);
  DTRAIN_RETURN_IF_ERROR(OnEveryWorker(
      "predict_step",
      [&](int i, grpc::ClientContext* context) {
        return stubs_[i]->PredictStep(context, requests[i], &responses[i]);
      },
      options_.step_timeout));
  // One row per sample, in sample order; the columns are the outputs with one value per sample
  // (the zoo's "label"; a [batch, classes] "logits" has no single value and is left out).
  std::map<int64_t, std::map<std::string, std::string>> rows;
  std::set<std::string> columns;
  for (int i = 0; i < n; ++i) {
    for (int local = 0; local < responses[i].results_size(); ++local) {
      const int rank = ranks_of_worker_[i][local];
      const v1::LocalResult& result = responses[i].results(local);
      for (int b = 0; b < result.batches_size() && b < static_cast<int>(shards[rank].size()); ++b) {
        const std::vector<int64_t>& indices = shards[rank][b];
        for (const auto& [name, proto] : result.batches(b).tensors()) {
          absl::StatusOr<HostTensor> t = FromProto(proto);
          if (!t.ok() || t->shape.size() != 1 ||
              t->shape[0] != static_cast<int64_t>(indices.size()))
            continue;
          if (t->dtype != v1::DTYPE_INT64 && t->dtype != v1::DTYPE_FLOAT32) continue;
          columns.insert(name);
          const std::vector<int64_t> ints =
              t->dtype == v1::DTYPE_INT64 ? t->ToVector<int64_t>() : std::vector<int64_t>();
          const std::vector<float> floats =
              t->dtype == v1::DTYPE_FLOAT32 ? t->ToVector<float>() : std::vector<float>();
          for (size_t k = 0; k < indices.size(); ++k) {
            rows[indices[k]][name] = ints.empty() ? absl::StrCat(floats[k]) : absl::StrCat(ints[k]);
          }
        }
      }
    }
  }
  const std::string path = options_.output_dir + "/predictions.csv";
  std::ofstream out(path, std::ios::trunc);
  out << "index";
  for (const std::string& c : columns) out << "," << c;
  out << "\n";
  for (const auto& [index, values] : rows) {
    out << index;
    for (const std::string& c : columns) {
      auto it = values.find(c);
      out << "," << (it == values.end() ? "" : it->second);
    }
    out << "\n";
  }
  if (!out) return absl::FailedPreconditionError(absl::StrCat("cannot write '", path, "'"));
  reporter_->Log(absl::StrCat("predictions for ", rows.size(), " samples written to ", path));
  reporter_->Predictions(path);
  return absl::OkStatus();
}

void Trainer::Teardown() {
  if (stubs_.empty()) return;
  // Not through calls_: a cancelled job still tears down.
  ParallelCalls teardown;
  const std::vector<grpc::Status> results = teardown.Run(
      static_cast<int>(stubs_.size()),
      [&](int i, grpc::ClientContext* context) {
        v1::TeardownRequest request;
        request.set_job_id(options_.job_id);
        v1::TeardownResponse response;
        return stubs_[i]->Teardown(context, request, &response);
      },
      // No early cancellation: one worker's teardown failing says nothing about the others',
      // and an elastic job keeps exactly the workers whose teardown succeeded.
      kTeardownTimeout, absl::Now() + kTeardownTimeout);
  NoteUnreachable(results);
  for (size_t i = 0; i < results.size(); ++i) {
    if (!results[i].ok()) teardown_failed_.insert(static_cast<int>(i));
  }
}

std::vector<std::string> Trainer::lost_workers() const {
  std::set<int> lost = unreachable_;
  lost.insert(teardown_failed_.begin(), teardown_failed_.end());
  std::set<std::string> names(drained_.begin(), drained_.end());
  for (int i : lost) names.insert(options_.workers[i].name());
  return std::vector<std::string>(names.begin(), names.end());
}

absl::Status Trainer::Run() {
  const v1::JobSpec& spec = options_.spec;
  progress_.set_phase("setup");
  Report();
  absl::Status status = [&]() -> absl::Status {
    DTRAIN_RETURN_IF_ERROR(Setup());
    int64_t start_epoch = 0;
    int64_t start_batch = 0;
    if (!spec.resume_from().empty()) {
      const int n = static_cast<int>(stubs_.size());
      std::vector<v1::LoadCheckpointResponse> loaded(n);
      auto load_from = [&](const std::string& path) {
        v1::LoadCheckpointRequest load;
        load.set_job_id(options_.job_id);
        load.set_path(path);
        return OnEveryWorker(
            "load_checkpoint",
            [&](int i, grpc::ClientContext* context) {
              return stubs_[i]->LoadCheckpoint(context, load, &loaded[i]);
            },
            options_.step_timeout);
      };
      std::string resumed_from = spec.resume_from();
      absl::Status load_status = load_from(resumed_from);
      if (load_status.code() == absl::StatusCode::kInvalidArgument ||
          load_status.code() == absl::StatusCode::kDataLoss) {
        // Unreadable (truncated by a crash mid-write, corrupted): the newest other checkpoint
        // of the same directory that loads, saying so. Every rank read the same error (rank 0
        // reads and broadcasts), so they retry together.
        for (const std::string& candidate : OtherCheckpoints(resumed_from)) {
          reporter_->Log(absl::StrCat("checkpoint ", resumed_from, " is unreadable (",
                                      load_status.message(), "); trying ", candidate));
          if (load_from(candidate).ok()) {
            resumed_from = candidate;
            load_status = absl::OkStatus();
            reporter_->Log(
                absl::StrCat("resuming from ", candidate, " instead of ", spec.resume_from()));
            break;
          }
        }
      }
      if (!load_status.ok() && !options_.resume_why.empty()) {
        return absl::Status(load_status.code(),
                            absl::StrCat("cannot resume ", options_.resume_why, " from ",
                                         spec.resume_from(), ": ", load_status.message()));
      }
      DTRAIN_RETURN_IF_ERROR(load_status);
      global_step_ = loaded[0].global_step();
      // Resume exactly after the last step taken: the same epoch's order (seeded by epoch)
      // minus the batches already done.
      const int64_t accumulate = spec.trainer().accumulate_grad_batches();
      const int64_t steps_per_epoch = CeilDiv(batches_per_epoch_, accumulate);
      start_epoch = global_step_ / steps_per_epoch;
      start_batch = (global_step_ % steps_per_epoch) * accumulate;
      reporter_->Log(absl::StrCat("resumed from ", resumed_from, " at step ", global_step_,
                                  " (epoch ", start_epoch, ", batch ", start_batch, ")"));
    }
    fit_start_ = absl::Now();
    const std::string& stage = spec.stage();
    if (stage == "fit" || stage.empty()) {
      bool stop = false;
      for (int64_t epoch = start_epoch; epoch < spec.trainer().max_epochs() && !stop; ++epoch) {
        DTRAIN_RETURN_IF_ERROR(TrainEpoch(epoch, epoch == start_epoch ? start_batch : 0, &stop));
        reporter_->Log(absl::StrCat("epoch ", epoch, " done: step ", global_step_, ", train_loss ",
                                    absl::SixDigits(last_loss_), ", ",
                                    absl::SixDigits(progress_.samples_per_second()), " samples/s"));
      }
      DTRAIN_RETURN_IF_ERROR(
          SaveCheckpoint(options_.checkpoint_dir + "/last.ckpt", progress_.epoch()));
    }
    std::map<std::string, double> overall;
    std::vector<std::map<std::string, double>> per_rank;
    if (stage == "validate") {
      DTRAIN_RETURN_IF_ERROR(EvaluateAndReport("val", /*test=*/false, &overall, &per_rank));
    }
    if ((stage == "fit" && !spec.trainer().skip_test()) || stage == "test") {
      DTRAIN_RETURN_IF_ERROR(EvaluateAndReport("test", /*test=*/true, &overall, &per_rank));
    }
    if (stage == "predict") DTRAIN_RETURN_IF_ERROR(Predict());
    progress_.set_phase("done");
    Report();
    return absl::OkStatus();
  }();
  if (cancelled_) status = absl::CancelledError("cancelled by request");
  return status;
}

}  // namespace dtrain
