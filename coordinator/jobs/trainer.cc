#include "coordinator/jobs/trainer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>

#include <google/protobuf/util/json_util.h>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/channel.h"
#include "common/file_reference.h"
#include "common/grpc_status.h"
#include "common/job_spec.h"
#include "common/setup_request.h"
#include "common/status_macros.h"
#include "common/tensor.h"
#include "coordinator/jobs/distributed_sampler.h"
#include "coordinator/jobs/early_stopping.h"
#include "coordinator/jobs/model_checkpoint.h"
#include "coordinator/jobs/prediction_writer.h"

namespace dtrain {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

Trainer::Trainer(TrainerOptions options, TrainerReporter* reporter)
    : options_(std::move(options)),
      reporter_(reporter),
      workers_(options_.job_id, options_.workers),
      call_sizer_(options_.spec.trainer().batches_per_call()) {
  // In Lightning's order: checkpoint on the validation's metrics before early stopping ends fit.
  auto checkpoints = std::make_unique<ModelCheckpoint>(options_.spec.checkpoint(), options_.files);
  if (!checkpoints->best_name().empty()) {
    best_checkpoint_ = CheckpointReference(checkpoints->best_name());
  }
  callbacks_.push_back(std::move(checkpoints));
  callbacks_.push_back(std::make_unique<EarlyStopping>(options_.spec.early_stopping()));
  callbacks_.push_back(std::make_unique<PredictionWriter>(options_.output_dir));
}

void Trainer::Log(const std::string& line) { reporter_->Log(line); }

void Trainer::ReportPredictions(const std::string& path) {
  reporter_->Predictions(path);
  if (!options_.store_file) return;
  // Kept by the coordinator's store too, so it downloads like a checkpoint.
  absl::StatusOr<std::string> digest = options_.store_file(path);
  if (!digest.ok()) {
    reporter_->Log(
        absl::StrCat("predictions are in ", path,
                     " but could not be stored for download: ", digest.status().message()));
    return;
  }
  v1::JobFile file = NewJobFile(std::filesystem::path(path).filename().string(), "predictions");
  file.set_location(JobFileReference(options_.job_id, file.name()));
  file.set_digest(*digest);
  std::error_code error;
  file.set_size_bytes(static_cast<int64_t>(std::filesystem::file_size(path, error)));
  reporter_->KeepFile(file, {});
}

v1::JobFile Trainer::NewJobFile(const std::string& name, const std::string& kind) const {
  v1::JobFile file;
  file.set_name(name);
  file.set_kind(kind);
  file.set_step(global_step_);
  file.set_epoch(progress_.epoch());
  file.set_created_unix_ms(absl::ToUnixMillis(absl::Now()));
  return file;
}

std::string Trainer::CheckpointReference(const std::string& name) const {
  const std::string& dirpath = options_.spec.checkpoint().dirpath();
  return dirpath.empty() ? JobFileReference(options_.job_id, name)
                         : absl::StrCat(dirpath, "/", name);
}

void Trainer::SetBestCheckpoint(const std::string& name) {
  best_checkpoint_ = CheckpointReference(name);
  reporter_->Checkpoint(last_checkpoint_, best_checkpoint_);
}

absl::Status Trainer::Setup() {
  const v1::JobSpec& spec = options_.spec;
  const v1::TrainerConfig& t = spec.trainer();
  const bool distributed = IsDistributedStrategy(t.strategy());
  world_ = distributed ? static_cast<int>(options_.workers.size()) * RanksPerWorker(spec) : 1;

  SetupContext context;
  context.job_id = options_.job_id;
  context.coordinator = options_.coordinator;
  context.group = options_.group;
  context.token = options_.job_token;
  context.world_size = world_;
  context.register_timeout = options_.setup_timeout;
  v1::SetupRequest request = MakeSetupRequest(spec, context);
  const v1::DataConfig& d = spec.data();

  const int n = workers_.size();
  if (options_.clear_stale_runs) {
    // Teardown of this job id is a no-op on a worker that does not hold it.
    DTRAIN_RETURN_IF_ERROR(workers_.OnEvery(
        "teardown of the run before the coordinator restarted",
        [&](int i, grpc::ClientContext* context) {
          v1::TeardownRequest stale;
          stale.set_job_id(options_.job_id);
          v1::TeardownResponse response;
          return workers_.stub(i).Teardown(context, stale, &response);
        },
        kTeardownTimeout));
  }
  std::vector<v1::SetupResponse> responses(n);
  reporter_->Log(absl::StrCat("setting up ", n, " worker(s) for ", world_, " rank(s), strategy ",
                              t.strategy()));
  const absl::Status setup = workers_.OnEvery(
      "setup",
      [&](int i, grpc::ClientContext* context) {
        return workers_.stub(i).Setup(context, request, &responses[i]);
      },
      options_.setup_timeout + absl::Seconds(30));
  if (setup.code() == absl::StatusCode::kUnavailable && options_.draining_workers) {
    // A worker stopped before its Setup arrived, so it refused it: a planned stop, as if it had
    // drained at step 0. Nothing was trained, so the job re-forms from where it started.
    std::vector<std::string> draining = options_.draining_workers();
    if (!draining.empty()) {
      reporter_->Log(absl::StrCat("worker(s) ", absl::StrJoin(draining, ", "),
                                  " stopped before the job was set up (", setup.message(), ")"));
      drained_ = std::move(draining);
      return setup;
    }
  }
  DTRAIN_RETURN_IF_ERROR(setup);
  // The collectives' data plane: the ranks choose it together, so every worker names the same.
  int64_t group_ms = 0;
  std::map<std::string, std::vector<std::string>> workers_by_note;
  for (int i = 0; i < n; ++i) {
    group_ms = std::max(group_ms, responses[i].group_formation_ms());
    const std::string& note = responses[i].collective_plane_note();
    if (!note.empty()) workers_by_note[note].push_back(workers_.info(i).name());
  }
  std::vector<std::string> notes;
  for (const auto& [note, names] : workers_by_note)
    notes.push_back(absl::StrCat(absl::StrJoin(names, ", "), ": ", note));
  if (!responses.empty() && !responses[0].collective_plane().empty()) {
    progress_.set_collective_plane(responses[0].collective_plane());
    phases_.Set("group", absl::Milliseconds(group_ms));
    reporter_->Log(absl::StrCat("collective plane: ", responses[0].collective_plane(),
                                " (collective_backend ", t.collective_backend(), ")",
                                notes.empty() ? "" : "; ", absl::StrJoin(notes, "; ")));
  }
  std::vector<std::vector<int>> ranks_of_worker(n);
  std::vector<std::string> where(world_);  // by rank, for the log
  std::vector<bool> seen(world_, false);
  for (int i = 0; i < n; ++i) {
    for (int local = 0; local < responses[i].ranks_size(); ++local) {
      const v1::RankInfo& r = responses[i].ranks(local);
      if (r.rank() < 0 || r.rank() >= world_ || seen[r.rank()] || r.world_size() != world_) {
        return absl::InternalError(absl::StrCat("worker '", workers_.info(i).name(),
                                                "' reported rank ", r.rank(), " of ",
                                                r.world_size(), "; expected a world of ", world_));
      }
      seen[r.rank()] = true;
      ranks_of_worker[i].push_back(r.rank());
      where[r.rank()] = absl::StrCat("rank ", r.rank(), " on '", workers_.info(i).name(),
                                     "' (node ", r.node_rank(), ", local ", r.local_rank(),
                                     r.cpus().empty() ? "" : ", cpus ", r.cpus(), ")");
    }
  }
  workers_.SetRanks(std::move(ranks_of_worker));
  for (const v1::SplitInfo& s : responses[0].splits()) split_sizes_[s.name()] = s.size();
  if (split_sizes_["train"] <= 0 && (spec.stage() == "fit" || spec.stage().empty()))
    return absl::InvalidArgumentError("data: fit needs a train split, and it is empty or missing");
  int64_t n_train = split_sizes_["train"];
  if (d.limit_train_samples() > 0) n_train = std::min(n_train, d.limit_train_samples());
  split_sizes_["train"] = n_train;
  batches_per_epoch_ = CeilDiv(CeilDiv(n_train, world_), d.batch_size());
  // Each epoch's last batch closes its accumulation window (as Lightning steps at epoch end).
  total_steps_ = CeilDiv(batches_per_epoch_, t.accumulate_grad_batches()) * t.max_epochs();
  if (t.max_steps() > 0) total_steps_ = std::min(total_steps_, t.max_steps());
  std::vector<std::string> names;
  for (int i = 0; i < n; ++i) names.push_back(workers_.Describe(i));
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

void Trainer::LogRankAccounting() {
  if (rank_seconds_.empty()) return;
  // Where training's wall time went on each rank: its own work, and waiting for gradients (the
  // communication backward did not hide, and the lead of a faster rank over a slower one).
  // What no rank spent is the coordinator's: driving the steps between the ranks' batches.
  constexpr int kLoggedRanks = 8;
  std::vector<std::string> parts;
  double busiest = 0;
  for (const auto& [rank, seconds] : rank_seconds_) {
    const auto& [in_steps, waiting] = seconds;
    busiest = std::max(busiest, in_steps);
    if (static_cast<int>(parts.size()) < kLoggedRanks) {
      parts.push_back(
          absl::StrFormat("rank %d %.2f s in steps, %.2f s (%.1f%%) of it waiting "
                          "for gradients",
                          rank, in_steps, waiting, in_steps > 0 ? 100 * waiting / in_steps : 0.0));
    }
  }
  if (rank_seconds_.size() > kLoggedRanks) {
    parts.push_back(absl::StrCat("and ", rank_seconds_.size() - kLoggedRanks, " more"));
  }
  const double train = absl::ToDoubleSeconds(phases_.Get("train"));
  reporter_->Log(absl::StrFormat(
      "time by rank: %s; between steps (the coordinator) %.2f s of %.2f s in %s",
      absl::StrJoin(parts, "; "), std::max(0.0, train - busiest), train, call_sizer_.Summary()));
}

void Trainer::Report() {
  phases_.Export(progress_.mutable_phase_seconds());
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
    batches[r] = Batches(TrainShard(split_sizes_["train"], world_, r, spec.data().shuffle(),
                                    spec.seed_everything(), epoch),
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
    if (workers_.cancelled()) return absl::CancelledError("the job was cancelled");
    // A stopping worker is let go at an optimizer-step boundary (no half-accumulated
    // gradients are lost), after a checkpoint every rank writes, so the job resumes exactly here.
    if (b % t.accumulate_grad_batches() == 0 && options_.draining_workers) {
      std::vector<std::string> draining = options_.draining_workers();
      if (!draining.empty()) return LetDrainingWorkersGo(std::move(draining));
    }
    int64_t next_val = (b / interval + 1) * interval;
    if (vci <= 1) next_val = std::min(next_val, nb);
    int64_t chunk = std::min<int64_t>({call_sizer_.Next(), nb - b, next_val - b});
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
    const int n = workers_.size();
    std::vector<v1::StepRequest> requests(n);
    std::vector<v1::StepResponse> responses(n);
    for (int i = 0; i < n; ++i) {
      requests[i].set_job_id(options_.job_id);
      requests[i].set_epoch(epoch);
      requests[i].set_end_of_epoch(b + chunk == nb);
      requests[i].set_total_steps(total_steps_);
      for (int rank : workers_.ranks(i)) {
        v1::LocalWork* work = requests[i].add_work();
        work->set_first_batch_idx(b);
        for (int64_t k = b; k < b + chunk; ++k) {
          v1::IndexBatch* batch = work->add_index_batches();
          batch->set_split("train");
          batch->mutable_indices()->Add(batches[rank][k].begin(), batches[rank][k].end());
        }
      }
    }
    if (!first_step_seen_) {
      first_step_seen_ = true;
      const absl::Duration since_submit = absl::Now() - options_.submitted;
      phases_.Set("first_step", since_submit);
      reporter_->Log(absl::StrFormat("first training step starts %.2f s after submit",
                                     absl::ToDoubleSeconds(since_submit)));
    }
    const absl::Time call_start = absl::Now();
    {
      PhaseClock::Span timed = phases_.Time("train");
      DTRAIN_RETURN_IF_ERROR(workers_.OnEveryAsync(
          "training_step",
          [&](int i, grpc::ClientContext* context, ParallelCalls::Done done) {
            workers_.stub(i).async()->TrainingStep(context, &requests[i], &responses[i],
                                                   std::move(done));
          },
          options_.step_timeout));
    }
    call_sizer_.Observe(chunk, absl::Now() - call_start);
    // Every scalar the steps returned, averaged over the chunk's batches on every rank: the
    // loss, training_step's other keys (logged as train_<key>) and grad_norm when clipping.
    std::map<std::string, std::pair<double, int64_t>> scalars;
    const int64_t step_before = global_step_;
    for (const v1::StepResponse& response : responses) {
      for (const v1::LocalResult& result : response.results()) {
        global_step_ = result.global_step();
        auto& [in_steps, waiting] = rank_seconds_[result.rank()];
        in_steps += result.step_seconds();
        waiting += result.gradient_wait_seconds();
        for (const v1::BatchResult& batch : result.batches()) {
          for (const auto& [name, value] : batch.scalars()) {
            auto& [sum, count] = scalars[name];
            sum += value;
            ++count;
          }
          samples_done_ += batch.size();
        }
      }
    }
    auto mean = [&](const std::string& name) {
      const auto& [sum, count] = scalars[name];
      return count > 0 ? sum / count : 0.0;
    };
    last_loss_ = mean("loss");
    b += chunk;
    progress_.set_batch_in_epoch(b);
    const int64_t every = t.log_every_n_steps();
    if (global_step_ / every != step_before / every || b == nb) {
      reporter_->Metric("train_loss", last_loss_, global_step_, epoch);
      for (const auto& [name, sum_count] : scalars) {
        if (name == "loss" || sum_count.second == 0) continue;
        reporter_->Metric(name == "grad_norm" ? name : "train_" + name, mean(name), global_step_,
                          epoch);
      }
    }
    Report();
    for (const auto& callback : callbacks_) {
      DTRAIN_RETURN_IF_ERROR(callback->OnTrainBatchesEnd(*this, step_before));
    }
    if (b == next_val) {
      DTRAIN_RETURN_IF_ERROR(Validate(stop));
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
  requests->assign(workers_.size(), v1::StepRequest());
  if (shards != nullptr) shards->assign(world_, {});
  for (int i = 0; i < workers_.size(); ++i) {
    (*requests)[i].set_job_id(options_.job_id);
    for (int rank : workers_.ranks(i)) {
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
                               ValidationMetrics* metrics) {
  const int n = workers_.size();
  std::vector<v1::StepRequest> requests;
  std::vector<v1::StepResponse> responses(n);
  EvalRequests(split, limit_samples, test ? 0 : options_.spec.trainer().limit_val_batches(),
               &requests, nullptr);
  DTRAIN_RETURN_IF_ERROR(workers_.OnEveryAsync(
      test ? "test_step" : "validation_step",
      [&](int i, grpc::ClientContext* context, ParallelCalls::Done done) {
        if (test) {
          workers_.stub(i).async()->TestStep(context, &requests[i], &responses[i], std::move(done));
        } else {
          workers_.stub(i).async()->ValidationStep(context, &requests[i], &responses[i],
                                                   std::move(done));
        }
      },
      options_.step_timeout));
  // Sample-weighted means: every sample counts once, whichever rank saw it.
  const std::string prefix = test ? "test_" : "val_";
  std::map<std::string, std::pair<double, int64_t>> sums;
  std::vector<std::map<std::string, double>>* per_rank = &metrics->by_rank;
  per_rank->assign(world_, {});
  for (int i = 0; i < n; ++i) {
    for (int local = 0; local < responses[i].results_size(); ++local) {
      const int rank = workers_.ranks(i)[local];
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
  metrics->overall.clear();
  for (const auto& [name, sum] : sums) metrics->overall[name] = sum.first / sum.second;
  return absl::OkStatus();
}

absl::Status Trainer::SaveCheckpoint(const Save& save) {
  const std::string previous_phase = progress_.phase();
  progress_.set_phase("checkpoint");
  Report();
  PhaseClock::Span timed = phases_.Time("checkpoint");
  v1::SaveCheckpointRequest request;
  request.set_job_id(options_.job_id);
  request.set_name(save.name);
  request.set_epoch(progress_.epoch());
  for (const std::string& name : save.evict) request.add_remove(name);
  std::string spec_json;
  (void)google::protobuf::util::MessageToJsonString(options_.spec, &spec_json);
  request.set_job_spec_json(spec_json);
  const int n = workers_.size();
  std::vector<v1::SaveCheckpointResponse> responses(n);
  DTRAIN_RETURN_IF_ERROR(workers_.OnEvery(
      "save_checkpoint",
      [&](int i, grpc::ClientContext* context) {
        return workers_.stub(i).SaveCheckpoint(context, request, &responses[i]);
      },
      options_.step_timeout));
  v1::JobFile file = NewJobFile(save.name, "checkpoint");
  file.set_location(CheckpointReference(save.name));
  if (save.monitored.has_value()) file.set_monitored(*save.monitored);
  for (const v1::SaveCheckpointResponse& r : responses) {
    if (!absl::c_linear_search(r.written(), true)) continue;
    file.set_digest(r.digest());
    file.set_size_bytes(r.bytes());
  }
  if (options_.spec.checkpoint().dirpath().empty() && file.digest().empty()) {
    return absl::InternalError(absl::StrCat("checkpoint ", save.name,
                                            ": no worker reports sending it to the coordinator"));
  }
  reporter_->KeepFile(file, save.evict);
  last_checkpoint_ = file.location();
  progress_.set_phase(previous_phase);
  reporter_->Log(absl::StrCat("checkpoint written: ", file.location(), " (step ", global_step_,
                              ", ", file.size_bytes(), " bytes",
                              file.digest().empty() ? "" : absl::StrCat(", ", file.digest()), ")"));
  reporter_->Checkpoint(last_checkpoint_, best_checkpoint_);
  return absl::OkStatus();
}

absl::Status Trainer::LetDrainingWorkersGo(std::vector<std::string> names) {
  std::vector<std::string> quoted;
  for (const std::string& name : names) quoted.push_back(absl::StrCat("'", name, "'"));
  reporter_->Log(absl::StrCat("worker(s) ", absl::StrJoin(quoted, ", "),
                              " are stopping: checkpointing at step ", global_step_,
                              " to let them go"));
  // Every rank writes where the job resumes: last.ckpt, as ModelCheckpoint names it.
  DTRAIN_RETURN_IF_ERROR(SaveCheckpoint({ModelCheckpoint::kLastName, {}, std::nullopt}));
  drained_ = std::move(names);
  return absl::UnavailableError(absl::StrCat("worker(s) ", absl::StrJoin(quoted, ", "),
                                             " stopped (drained); checkpointed at step ",
                                             global_step_));
}

absl::Status Trainer::Validate(bool* stop) {
  if (split_sizes_.count("val") == 0 || split_sizes_["val"] == 0) return absl::OkStatus();
  ValidationMetrics metrics;
  DTRAIN_RETURN_IF_ERROR(EvaluateAndReport("val", /*test=*/false, &metrics));
  for (const auto& callback : callbacks_) {
    DTRAIN_RETURN_IF_ERROR(callback->OnValidationEnd(*this, metrics, stop));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> Trainer::AnyRankDecides(const std::vector<bool>& by_rank) {
  const int n = workers_.size();
  std::vector<v1::DecisionResponse> decisions(n);
  DTRAIN_RETURN_IF_ERROR(workers_.OnEvery(
      "reduce_boolean_decision",
      [&](int i, grpc::ClientContext* context) {
        v1::DecisionRequest request;
        request.set_job_id(options_.job_id);
        request.set_all(false);
        for (int rank : workers_.ranks(i)) {
          request.add_decisions(rank < static_cast<int>(by_rank.size()) && by_rank[rank]);
        }
        return workers_.stub(i).ReduceBooleanDecision(context, request, &decisions[i]);
      },
      options_.step_timeout));
  return decisions[0].decision();
}

absl::Status Trainer::EvaluateAndReport(const std::string& split, bool test,
                                        ValidationMetrics* metrics) {
  if (split_sizes_[split] <= 0) {
    if (options_.spec.stage() == "fit") return absl::OkStatus();  // nothing to evaluate
    return absl::FailedPreconditionError(
        absl::StrCat("data: the dataset has no ", split, " split"));
  }
  progress_.set_phase(test ? "test" : "validate");
  Report();
  const v1::DataConfig& d = options_.spec.data();
  {
    PhaseClock::Span timed = phases_.Time(test ? "test" : "validation");
    DTRAIN_RETURN_IF_ERROR(
        Evaluate(split, test ? d.limit_test_samples() : d.limit_val_samples(), test, metrics));
  }
  std::vector<std::string> parts;
  for (const auto& [name, value] : metrics->overall) {
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
  // Over the data's own predict split when it has one (a tensors file may), else the test split.
  const std::string split = split_sizes_["predict"] > 0 ? "predict" : "test";
  if (split_sizes_[split] <= 0) {
    return absl::FailedPreconditionError(
        "data: predict runs over the predict split, or the test split, and both are empty");
  }
  progress_.set_phase("predict");
  Report();
  PhaseClock::Span timed = phases_.Time("predict");
  const int n = workers_.size();
  std::vector<v1::StepRequest> requests;
  std::vector<std::vector<std::vector<int64_t>>> shards;
  EvalRequests(split, spec.data().limit_test_samples(), 0, &requests, &shards);
  size_t most_batches = 0;
  for (const auto& shard : shards) most_batches = std::max(most_batches, shard.size());
  // One row per sample, in sample order; the columns are the outputs with one value per sample
  // (the zoo's "label"; a [batch, classes] "logits" has no single value and is left out).
  PredictionRows predictions;
  std::map<int64_t, std::map<std::string, std::string>>& rows = predictions.rows;
  std::set<std::string>& columns = predictions.columns;
  // A fixed number of batches per call (batches_per_call, or 16 when training's are sized by
  // time): each response holds that many batches' outputs, which keeps it small (and within one
  // message of a default client).
  const size_t per_call = static_cast<size_t>(call_sizer_.PredictBatches());
  for (size_t first = 0; first < std::max<size_t>(most_batches, 1); first += per_call) {
    // Only this call's batches are copied out of each rank's shard.
    std::vector<v1::StepRequest> chunk(n);
    for (int i = 0; i < n; ++i) {
      chunk[i].set_job_id(requests[i].job_id());
      chunk[i].set_return_outputs(true);
      for (const v1::LocalWork& all : requests[i].work()) {
        v1::LocalWork* work = chunk[i].add_work();
        work->set_first_batch_idx(static_cast<int64_t>(first));
        for (size_t b = first;
             b < first + per_call && b < static_cast<size_t>(all.index_batches_size()); ++b) {
          *work->add_index_batches() = all.index_batches(static_cast<int>(b));
        }
      }
    }
    std::vector<v1::StepResponse> responses(n);
    DTRAIN_RETURN_IF_ERROR(workers_.OnEveryAsync(
        "predict_step",
        [&](int i, grpc::ClientContext* context, ParallelCalls::Done done) {
          workers_.stub(i).async()->PredictStep(context, &chunk[i], &responses[i], std::move(done));
        },
        options_.step_timeout));
    for (int i = 0; i < n; ++i) {
      for (int local = 0; local < responses[i].results_size(); ++local) {
        const int rank = workers_.ranks(i)[local];
        const v1::LocalResult& result = responses[i].results(local);
        for (int b = 0; b < result.batches_size() && first + b < shards[rank].size(); ++b) {
          const std::vector<int64_t>& indices = shards[rank][first + b];
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
              rows[indices[k]][name] =
                  ints.empty() ? absl::StrCat(floats[k]) : absl::StrCat(ints[k]);
            }
          }
        }
      }
    }
  }
  for (const auto& callback : callbacks_) {
    DTRAIN_RETURN_IF_ERROR(callback->OnPredictEnd(*this, predictions));
  }
  return absl::OkStatus();
}

std::vector<std::string> Trainer::lost_workers() const {
  std::vector<std::string> lost = workers_.lost();
  std::set<std::string> names(lost.begin(), lost.end());
  names.insert(drained_.begin(), drained_.end());
  return std::vector<std::string>(names.begin(), names.end());
}

absl::Status Trainer::LoadCheckpoint(const std::string& path,
                                     std::vector<v1::LoadCheckpointResponse>* loaded) {
  std::vector<v1::LoadCheckpointResponse> answers(workers_.size());
  v1::LoadCheckpointRequest load;
  load.set_job_id(options_.job_id);
  if (options_.resolve_file) {
    DTRAIN_ASSIGN_OR_RETURN(*load.mutable_path(), options_.resolve_file(path));
  } else {
    load.set_path(path);
  }
  absl::Status status = workers_.OnEvery(
      "load_checkpoint",
      [&](int i, grpc::ClientContext* context) {
        return workers_.stub(i).LoadCheckpoint(context, load, &answers[i]);
      },
      options_.step_timeout);
  if (loaded != nullptr) *loaded = std::move(answers);
  return status;
}

absl::Status Trainer::LoadTestWeights() {
  if (options_.spec.trainer().test_ckpt_path() != "best") return absl::OkStatus();
  // Without a monitor the best is the last save, which holds the weights fit ended with.
  if (best_checkpoint_.empty() || best_checkpoint_ == last_checkpoint_) {
    reporter_->Log("testing the weights fit ended with (no better checkpoint by monitor)");
    return absl::OkStatus();
  }
  absl::Status status = LoadCheckpoint(best_checkpoint_, nullptr);
  if (!status.ok()) {
    return absl::Status(
        status.code(),
        absl::StrCat("cannot load the best checkpoint ", best_checkpoint_, " for the test (",
                     "trainer.test_ckpt_path: best): ", status.message()));
  }
  reporter_->Log(absl::StrCat("testing the best checkpoint ", best_checkpoint_));
  return absl::OkStatus();
}

absl::Status Trainer::Resume(int64_t* start_epoch, int64_t* start_batch) {
  const v1::JobSpec& spec = options_.spec;
  std::vector<v1::LoadCheckpointResponse> loaded(workers_.size());
  auto load_from = [&](const std::string& path) { return LoadCheckpoint(path, &loaded); };
  std::string resumed_from = spec.ckpt_path();
  absl::Status load_status = load_from(resumed_from);
  if (load_status.code() == absl::StatusCode::kInvalidArgument ||
      load_status.code() == absl::StatusCode::kDataLoss) {
    // Unreadable (truncated by a crash mid-write, corrupted): the newest other checkpoint of the
    // same directory that loads, saying so. Every rank read the same error (rank 0 reads and
    // broadcasts), so they retry together.
    const std::vector<std::string> siblings = options_.sibling_checkpoints
                                                  ? options_.sibling_checkpoints(resumed_from)
                                                  : ModelCheckpoint::Siblings(resumed_from);
    for (const std::string& candidate : siblings) {
      reporter_->Log(absl::StrCat("checkpoint ", resumed_from, " is unreadable (",
                                  load_status.message(), "); trying ", candidate));
      if (load_from(candidate).ok()) {
        resumed_from = candidate;
        load_status = absl::OkStatus();
        reporter_->Log(absl::StrCat("resuming from ", candidate, " instead of ", spec.ckpt_path()));
        break;
      }
    }
  }
  if (!load_status.ok() && !options_.resume_why.empty()) {
    return absl::Status(load_status.code(),
                        absl::StrCat("cannot resume ", options_.resume_why, " from ",
                                     spec.ckpt_path(), ": ", load_status.message()));
  }
  DTRAIN_RETURN_IF_ERROR(load_status);
  global_step_ = loaded[0].global_step();
  // Resume exactly after the last step taken: the same epoch's order (seeded by epoch) minus
  // the batches already done.
  const int64_t accumulate = spec.trainer().accumulate_grad_batches();
  const int64_t steps_per_epoch = CeilDiv(batches_per_epoch_, accumulate);
  *start_epoch = global_step_ / steps_per_epoch;
  *start_batch = (global_step_ % steps_per_epoch) * accumulate;
  reporter_->Log(absl::StrCat("resumed from ", resumed_from, " at step ", global_step_, " (epoch ",
                              *start_epoch, ", batch ", *start_batch, ")"));
  return absl::OkStatus();
}

absl::Status Trainer::Run() {
  const v1::JobSpec& spec = options_.spec;
  const absl::Time started = absl::Now();
  if (options_.submitted == absl::InfinitePast()) options_.submitted = started;
  phases_.Set("placement", started - options_.submitted);
  progress_.set_phase("setup");
  Report();
  absl::Status status = [&]() -> absl::Status {
    {
      PhaseClock::Span timed = phases_.Time("setup");
      DTRAIN_RETURN_IF_ERROR(Setup());
    }
    int64_t start_epoch = 0;
    int64_t start_batch = 0;
    if (!spec.ckpt_path().empty()) {
      PhaseClock::Span timed = phases_.Time("restore");
      DTRAIN_RETURN_IF_ERROR(Resume(&start_epoch, &start_batch));
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
      for (const auto& callback : callbacks_) DTRAIN_RETURN_IF_ERROR(callback->OnTrainEnd(*this));
      LogRankAccounting();
    }
    ValidationMetrics metrics;
    if (stage == "validate") {
      DTRAIN_RETURN_IF_ERROR(EvaluateAndReport("val", /*test=*/false, &metrics));
    }
    if (stage == "fit" && !spec.trainer().skip_test()) DTRAIN_RETURN_IF_ERROR(LoadTestWeights());
    if ((stage == "fit" && !spec.trainer().skip_test()) || stage == "test") {
      DTRAIN_RETURN_IF_ERROR(EvaluateAndReport("test", /*test=*/true, &metrics));
    }
    if (stage == "predict") DTRAIN_RETURN_IF_ERROR(Predict());
    progress_.set_phase("done");
    Report();
    return absl::OkStatus();
  }();
  if (workers_.cancelled()) status = absl::CancelledError("cancelled by request");
  // Where the run's seconds went, also for a failed run (a slow setup that timed out shows).
  reporter_->Log(
      absl::StrCat("time by phase: ", phases_.Summary(absl::Now() - started),
                   absl::StrFormat("; %.1f s since submit",
                                   absl::ToDoubleSeconds(absl::Now() - options_.submitted))));
  Report();
  return status;
}

}  // namespace dtrain
