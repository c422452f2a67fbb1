#include "coordinator/jobs/trainer.h"

#include <algorithm>
#include <filesystem>
#include <set>
#include <utility>

#include <google/protobuf/util/json_util.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/distributed_sampler.h"
#include "common/file_reference.h"
#include "common/job_spec.h"
#include "common/status_macros.h"
#include "coordinator/jobs/batch_limits.h"
#include "coordinator/jobs/early_stopping.h"
#include "coordinator/jobs/evaluation_loop.h"
#include "coordinator/jobs/fit_loop.h"
#include "coordinator/jobs/learning_rate_monitor.h"
#include "coordinator/jobs/loop_context.h"
#include "coordinator/jobs/metrics_logger.h"
#include "coordinator/jobs/model_checkpoint.h"
#include "coordinator/jobs/prediction_loop.h"
#include "coordinator/jobs/prediction_writer.h"
#include "coordinator/jobs/progress_reporter.h"
#include "coordinator/jobs/rank_timing.h"

namespace dtrain {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

bool Fits(const v1::JobSpec& spec) { return spec.stage() == "fit" || spec.stage().empty(); }

// What the job trains with, when its workers do not say it themselves (SetupResponse.
// optimization): the spec's optimizer section, or its defaults.
std::string DescribeOptimizer(const v1::JobSpec& spec) {
  const v1::OptimizerSpec& o = spec.optimizer();
  const std::string name = o.name().empty() ? "sgd" : o.name();
  std::string text = absl::StrCat("optimizer: ", name, ", lr ", o.lr());
  if (name == "sgd") {
    absl::StrAppend(&text, ", momentum ", o.momentum(), o.nesterov() ? " (nesterov)" : "");
  } else {
    absl::StrAppend(&text, ", betas (", o.beta1(), ", ", o.beta2(), "), eps ", o.eps());
  }
  absl::StrAppend(&text, ", weight_decay ", o.weight_decay());
  const v1::SchedulerSpec& s = spec.lr_scheduler();
  if (s.name() == "step") {
    absl::StrAppend(&text, "; lr_scheduler step (x", s.gamma(), " every ", s.step_size(),
                    " steps)");
  } else if (!s.name().empty() && s.name() != "none") {
    absl::StrAppend(&text, "; lr_scheduler ", s.name());
  }
  absl::StrAppend(&text,
                  " (the spec's optimizer section, or its defaults; a module's "
                  "configure_optimizers is not read)");
  return text;
}

}  // namespace

Trainer::Trainer(TrainerOptions options, TrainerReporter* reporter,
                 std::unique_ptr<WorkerGroup> workers)
    : options_(std::move(options)),
      reporter_(reporter),
      workers_(std::move(workers)),
      state_(options_.clock, options_.spec.trainer().batches_per_call()),
      callbacks_(this, Callbacks(), [this] { FlushMetrics(); }) {
  state_.stage = options_.spec.stage().empty() ? "fit" : options_.spec.stage();
  state_.max_epochs = options_.spec.trainer().max_epochs();
  (void)google::protobuf::util::MessageToJsonString(options_.spec, &spec_json_);
}

std::vector<std::unique_ptr<TrainerCallback>> Trainer::Callbacks() {
  // In the order they run: the loggers first (a checkpoint's log line follows the metrics
  // it was chosen by), then ModelCheckpoint before EarlyStopping (as Lightning: checkpoint
  // on the validation's metrics before early stopping ends fit).
  std::vector<std::unique_ptr<TrainerCallback>> list;
  list.push_back(std::make_unique<MetricsLogger>());
  list.push_back(std::make_unique<LearningRateMonitor>());
  list.push_back(std::make_unique<ProgressReporter>());
  // fast_dev_run checks that the code runs: as Lightning, it writes no checkpoint and
  // never stops early.
  if (options_.spec.trainer().fast_dev_run() == 0) {
    auto checkpoints =
        std::make_unique<ModelCheckpoint>(options_.spec.checkpoint(), options_.files);
    if (!checkpoints->best_name().empty()) {
      state_.best_checkpoint = CheckpointReference(checkpoints->best_name());
    }
    list.push_back(std::move(checkpoints));
    list.push_back(std::make_unique<EarlyStopping>(options_.spec.early_stopping()));
  }
  list.push_back(std::make_unique<RankTiming>());
  list.push_back(std::make_unique<PredictionWriter>(options_.output_dir));
  return list;
}

void Trainer::LogMetricAt(const std::string& name, double value, int64_t step) {
  v1::MetricPoint& p = pending_metrics_.emplace_back();
  p.set_name(name);
  p.set_value(value);
  p.set_step(step);
  p.set_epoch(state_.epoch);
}

void Trainer::FlushMetrics() {
  if (pending_metrics_.empty()) return;
  reporter_->Metrics(pending_metrics_);
  pending_metrics_.clear();
}

TrainerReporter& Trainer::FlushedReporter() {
  FlushMetrics();
  return *reporter_;
}

void Trainer::ReportPredictions(const std::string& path) {
  FlushedReporter().Predictions(path);
  if (!options_.store_file) return;
  // Kept by the coordinator's store too, so it downloads like a checkpoint.
  absl::StatusOr<std::string> digest = options_.store_file(path);
  if (!digest.ok()) {
    FlushedReporter().Log(
        absl::StrCat("predictions are in ", path,
                     " but could not be stored for download: ", digest.status().message()));
    return;
  }
  v1::JobFile file = NewJobFile(std::filesystem::path(path).filename().string(), "predictions");
  file.set_location(JobFileReference(options_.job_id, file.name()));
  file.set_digest(*digest);
  std::error_code error;
  file.set_size_bytes(static_cast<int64_t>(std::filesystem::file_size(path, error)));
  FlushedReporter().KeepFile(file, {});
}

v1::JobFile Trainer::NewJobFile(const std::string& name, const std::string& kind) const {
  v1::JobFile file;
  file.set_name(name);
  file.set_kind(kind);
  file.set_step(state_.global_step);
  file.set_epoch(state_.epoch);
  file.set_created_unix_ms(absl::ToUnixMillis(Now()));
  return file;
}

std::string Trainer::CheckpointReference(const std::string& name) const {
  const std::string& dir = options_.spec.checkpoint().dirpath();
  return dir.empty() ? JobFileReference(options_.job_id, name) : absl::StrCat(dir, "/", name);
}

void Trainer::SetBestCheckpoint(const std::string& name) {
  state_.best_checkpoint = CheckpointReference(name);
  FlushedReporter().Checkpoint(state_.last_checkpoint, state_.best_checkpoint);
}

absl::Status Trainer::Setup() {
  const v1::JobSpec& spec = options_.spec;
  const v1::TrainerConfig& t = spec.trainer();
  const int n = workers_->size();
  const int world = IsDistributedStrategy(t.strategy()) ? n * RanksPerWorker(spec) : 1;

  SetupContext context;
  context.job_id = options_.job_id;
  context.coordinator = options_.coordinator;
  context.group = options_.group;
  context.token = options_.job_token;
  context.world_size = world;
  context.register_timeout = options_.setup_timeout;
  FlushedReporter().Log(absl::StrCat("setting up ", n, " worker(s) for ", world,
                                     " rank(s), strategy ", t.strategy()));
  absl::StatusOr<GroupSetup> setup = workers_->Setup(spec, context, options_.clear_stale_runs);
  if (!setup.ok() && setup.status().code() == absl::StatusCode::kUnavailable &&
      options_.draining_workers) {
    // A worker stopped before its Setup arrived, so it refused it: a planned stop, as if it had
    // drained at step 0. Nothing was trained, so the job re-forms from where it started.
    std::vector<std::string> draining = options_.draining_workers();
    if (!draining.empty()) {
      FlushedReporter().Log(absl::StrCat("worker(s) ", absl::StrJoin(draining, ", "),
                                         " stopped before the job was set up (",
                                         setup.status().message(), ")"));
      drained_ = std::move(draining);
      return setup.status();
    }
  }
  DTRAIN_RETURN_IF_ERROR(setup.status());
  state_.world_size = setup->world_size;
  if (!setup->collective_plane.empty()) {
    state_.collective_plane = setup->collective_plane;
    state_.phases.Set("group", setup->group_formation);
    FlushedReporter().Log(absl::StrCat("collective plane: ", setup->collective_plane,
                                       " (collective_backend ", t.collective_backend(), ")",
                                       setup->plane_notes.empty() ? "" : "; ", setup->plane_notes));
  }
  if (!setup->hyper_parameters.empty()) FlushedReporter().HyperParameters(setup->hyper_parameters);
  state_.plateau_monitors = setup->plateau_monitors;
  optimization_ = setup->optimization;
  state_.split_sizes = setup->split_sizes;
  state_.streamed_splits = setup->streamed_splits;
  // Lists cost the workers time at every call's start (docs/decisions/trainer.md): say why.
  state_.sampled_work = setup->sampled_work && (!t.has_sampled_calls() || t.sampled_calls());
  if (Fits(spec) && (setup->sampled_work != state_.sampled_work || !setup->other_deals.empty())) {
    FlushedReporter().Log(absl::StrCat(
        "training calls list every rank's sample indices: ",
        setup->sampled_work
            ? "trainer.sampled_calls is false"
            : absl::StrCat(absl::StrJoin(setup->other_deals, "; "), "; this coordinator deals by '",
                           kSamplerDeal,
                           "': run workers of its version for calls that name their batches "
                           "by sampler")));
  }
  int64_t& n_train = state_.split_sizes["train"];
  if (n_train <= 0 && Fits(spec)) {
    return absl::InvalidArgumentError("data: fit needs a train split, and it is empty or missing");
  }
  if (spec.data().limit_train_samples() > 0) {
    n_train = std::min(n_train, spec.data().limit_train_samples());
  }
  // A streamed split leaves its last n mod world samples out of each epoch (a different few
  // each epoch): every rank streams floor(n / world).
  const int64_t per_rank = state_.streamed("train") ? n_train / world : CeilDiv(n_train, world);
  if (per_rank == 0 && Fits(spec)) {
    return absl::InvalidArgumentError(absl::StrCat("data: ", n_train, " training samples for ",
                                                   world, " ranks leave a rank none"));
  }
  state_.batches_per_epoch = CeilDiv(per_rank, spec.data().batch_size());
  if (Fits(spec)) {
    DTRAIN_ASSIGN_OR_RETURN(state_.batches_per_epoch,
                            LimitBatches(t, BatchLoop::kTrain, state_.batches_per_epoch));
  }
  if (t.fast_dev_run() > 0) {
    FlushedReporter().Log(absl::StrCat("fast_dev_run: ", t.fast_dev_run(),
                                       " batch(es) of each loop, one epoch, no checkpoint"));
  }
  // Each epoch's last batch closes its accumulation window (as Lightning steps at epoch end).
  state_.total_steps =
      CeilDiv(state_.batches_per_epoch, t.accumulate_grad_batches()) * t.max_epochs();
  if (t.max_steps() > 0) state_.total_steps = std::min(state_.total_steps, t.max_steps());
  if (Fits(spec) && t.fast_dev_run() == 0 && state_.batches_per_epoch > 0 &&
      state_.batches_per_epoch < t.log_every_n_steps()) {
    // Lightning's warning: per-step values get few points, or none in a short run.
    FlushedReporter().Log(absl::StrCat(
        "the number of training batches (", state_.batches_per_epoch,
        ") is smaller than the logging interval "
        "trainer.log_every_n_steps (",
        t.log_every_n_steps(), "); set a lower value to see per-step values in every epoch"));
  }
  FlushedReporter().Log(absl::StrCat(
      "group formed: ", absl::StrJoin(setup->workers, ", "),
      Fits(spec)
          ? absl::StrCat("; ", n_train, " training samples, ", state_.batches_per_epoch,
                         " batches per rank per epoch, ", state_.total_steps, " optimizer steps")
          : ""));
  std::vector<std::string> where = setup->ranks;
  constexpr int kLoggedRanks = 64;
  if (static_cast<int>(where.size()) > kLoggedRanks) {
    const size_t more = where.size() - kLoggedRanks;
    where.resize(kLoggedRanks);
    where.push_back(absl::StrCat("and ", more, " more"));
  }
  FlushedReporter().Log(absl::StrCat("ranks: ", absl::StrJoin(where, ", ")));
  if (Fits(spec)) {
    FlushedReporter().Log(optimization_.empty() ? DescribeOptimizer(spec)
                                                : absl::StrCat("optimizer: ", optimization_));
  }
  return absl::OkStatus();
}

void Trainer::RequestStop() {
  const v1::TrainerConfig& t = options_.spec.trainer();
  const int64_t epochs_done =
      state_.epoch + (state_.batch_in_epoch >= state_.batches_per_epoch ? 1 : 0);
  if (epochs_done < t.min_epochs() || state_.global_step < t.min_steps()) {
    if (!said_min_) {
      said_min_ = true;
      FlushedReporter().Log(absl::StrCat("early stopping waits for trainer.min_epochs ",
                                         t.min_epochs(), " and min_steps ", t.min_steps(), " (now ",
                                         epochs_done, " epochs, step ", state_.global_step, ")"));
    }
    return;
  }
  state_.should_stop = true;
}

absl::Status Trainer::SaveCheckpoint(const Save& save) {
  const std::string previous_phase = state_.phase;
  state_.phase = "checkpoint";
  callbacks_.Progress();
  PhaseClock::Span timed = state_.phases.Time("checkpoint");
  SaveCall call;
  call.name = save.name;
  call.epoch = state_.epoch;
  call.remove = save.evict;
  call.spec_json = spec_json_;
  call.total_steps = state_.total_steps;
  // At an epoch's end the plateau schedulers step before the state is written, so that the
  // checkpoint resumes as a run that never stopped (when every strict monitor has a value;
  // otherwise the next epoch's first call fails saying which is missing).
  if (!state_.plateau_monitors.empty() && state_.batch_in_epoch >= state_.batches_per_epoch &&
      state_.epoch > state_.plateau_stepped_epoch) {
    bool complete = true;
    for (const auto& [monitor, strict] : state_.plateau_monitors) {
      auto it = state_.callback_metrics.find(monitor);
      if (it != state_.callback_metrics.end()) {
        call.monitored[monitor] = it->second;
      } else if (strict) {
        complete = false;
      }
    }
    if (!complete) call.monitored.clear();
  }
  call.callbacks = callbacks_.StateDicts();
  DTRAIN_ASSIGN_OR_RETURN(SavedCheckpoint saved, workers_->Save(call));
  if (!call.monitored.empty()) state_.plateau_stepped_epoch = state_.epoch;
  v1::JobFile file = NewJobFile(save.name, "checkpoint");
  file.set_location(CheckpointReference(save.name));
  if (save.monitored.has_value()) file.set_monitored(*save.monitored);
  if (saved.written) {
    file.set_digest(saved.digest);
    file.set_size_bytes(saved.bytes);
  }
  if (options_.spec.checkpoint().dirpath().empty() && file.digest().empty()) {
    return absl::InternalError(absl::StrCat("checkpoint ", save.name,
                                            ": no worker reports sending it to the coordinator"));
  }
  FlushedReporter().KeepFile(file, save.evict);
  state_.last_checkpoint = file.location();
  state_.phase = previous_phase;
  FlushedReporter().Log(absl::StrCat("checkpoint written: ", file.location(), " (step ",
                                     state_.global_step, ", ", file.size_bytes(), " bytes",
                                     file.digest().empty() ? "" : absl::StrCat(", ", file.digest()),
                                     ")"));
  FlushedReporter().Checkpoint(state_.last_checkpoint, state_.best_checkpoint);
  return absl::OkStatus();
}

std::vector<std::string> Trainer::lost_workers() const {
  std::vector<std::string> lost = workers_->lost();
  std::set<std::string> names(lost.begin(), lost.end());
  names.insert(drained_.begin(), drained_.end());
  return std::vector<std::string>(names.begin(), names.end());
}

absl::StatusOr<LoadedCheckpoint> Trainer::LoadCheckpoint(const std::string& path) {
  std::string resolved = path;
  if (options_.resolve_file) {
    DTRAIN_ASSIGN_OR_RETURN(resolved, options_.resolve_file(path));
  }
  return workers_->Load(resolved);
}

absl::Status Trainer::LoadTestWeights() {
  if (options_.spec.trainer().test_ckpt_path() != "best") return absl::OkStatus();
  // Without a monitor the best is the last save, which holds the weights fit ended with.
  if (state_.best_checkpoint.empty() || state_.best_checkpoint == state_.last_checkpoint) {
    FlushedReporter().Log("testing the weights fit ended with (no better checkpoint by monitor)");
    return absl::OkStatus();
  }
  absl::Status status = LoadCheckpoint(state_.best_checkpoint).status();
  if (!status.ok()) {
    return absl::Status(
        status.code(),
        absl::StrCat("cannot load the best checkpoint ", state_.best_checkpoint, " for the test (",
                     "trainer.test_ckpt_path: best): ", status.message()));
  }
  FlushedReporter().Log(absl::StrCat("testing the best checkpoint ", state_.best_checkpoint));
  return absl::OkStatus();
}

absl::Status Trainer::Resume(int64_t* start_epoch, int64_t* start_batch) {
  const v1::JobSpec& spec = options_.spec;
  std::string resumed_from = spec.ckpt_path();
  absl::StatusOr<LoadedCheckpoint> loaded = LoadCheckpoint(resumed_from);
  if (loaded.status().code() == absl::StatusCode::kInvalidArgument ||
      loaded.status().code() == absl::StatusCode::kDataLoss) {
    // Unreadable (truncated by a crash mid-write, corrupted): the newest other checkpoint of the
    // same directory that loads, saying so. Every rank read the same error (rank 0 reads and
    // broadcasts), so they retry together.
    const absl::Status unreadable = loaded.status();
    const std::vector<std::string> siblings = options_.sibling_checkpoints
                                                  ? options_.sibling_checkpoints(resumed_from)
                                                  : ModelCheckpoint::Siblings(resumed_from);
    for (const std::string& candidate : siblings) {
      FlushedReporter().Log(absl::StrCat("checkpoint ", resumed_from, " is unreadable (",
                                         unreadable.message(), "); trying ", candidate));
      absl::StatusOr<LoadedCheckpoint> other = LoadCheckpoint(candidate);
      if (other.ok()) {
        resumed_from = candidate;
        loaded = std::move(other);
        FlushedReporter().Log(
            absl::StrCat("resuming from ", candidate, " instead of ", spec.ckpt_path()));
        break;
      }
    }
  }
  if (!loaded.ok() && !options_.resume_why.empty()) {
    return absl::Status(loaded.status().code(),
                        absl::StrCat("cannot resume ", options_.resume_why, " from ",
                                     spec.ckpt_path(), ": ", loaded.status().message()));
  }
  DTRAIN_RETURN_IF_ERROR(loaded.status());
  state_.global_step = loaded->global_step;
  callbacks_.LoadStateDicts(loaded->callbacks);
  // The checkpoint's epoch, until an epoch runs: a run resumed at its very end trains none, and
  // its last checkpoint keeps the epoch it had.
  state_.epoch = loaded->epoch;
  // Resume exactly after the last step taken: the same epoch's order (seeded by epoch) minus
  // the batches already done.
  const int64_t accumulate = spec.trainer().accumulate_grad_batches();
  const int64_t steps_per_epoch = CeilDiv(state_.batches_per_epoch, accumulate);
  *start_epoch = steps_per_epoch > 0 ? state_.global_step / steps_per_epoch : 0;
  *start_batch = steps_per_epoch > 0 ? (state_.global_step % steps_per_epoch) * accumulate : 0;
  // A checkpoint written at an epoch's end holds its plateau step (SaveCheckpoint).
  state_.plateau_stepped_epoch = *start_epoch - 1;
  FlushedReporter().Log(absl::StrCat("resumed from ", resumed_from, " at step ", state_.global_step,
                                     " (epoch ", *start_epoch, ", batch ", *start_batch, ")"));
  return absl::OkStatus();
}

absl::Status Trainer::RunStages() {
  const v1::JobSpec& spec = options_.spec;
  {
    PhaseClock::Span timed = state_.phases.Time("setup");
    DTRAIN_RETURN_IF_ERROR(Setup());
  }
  int64_t start_epoch = 0;
  int64_t start_batch = 0;
  if (!spec.ckpt_path().empty()) {
    PhaseClock::Span timed = state_.phases.Time("restore");
    DTRAIN_RETURN_IF_ERROR(Resume(&start_epoch, &start_batch));
  }
  state_.fit_start = Now();
  state_.fit_start_step = state_.global_step;
  LoopContext context{spec, *workers_, state_, callbacks_, *this, options_.clock};
  EvaluationLoop evaluation(context);
  const std::string& stage = state_.stage;
  if (stage == "fit" && state_.batches_per_epoch == 0) {
    FlushedReporter().Log(absl::StrCat("training is off (",
                                       DescribeBatchLimit(spec.trainer(), BatchLoop::kTrain),
                                       "): fit trains nothing"));
  } else if (stage == "fit") {
    // As Lightning's: a run that restarts from a checkpoint (ckpt_path, a re-formed or requeued
    // job) has validated before and runs no sanity check.
    if (spec.ckpt_path().empty()) DTRAIN_RETURN_IF_ERROR(evaluation.SanityCheck());
    FitLoop fit(context, evaluation, options_.draining_workers);
    absl::Status fitted = fit.Run(start_epoch, start_batch);
    drained_ = fit.drained();
    DTRAIN_RETURN_IF_ERROR(fitted);
  }
  if (stage == "validate") DTRAIN_RETURN_IF_ERROR(evaluation.Run(EvalKind::kValidation));
  const bool test_after_fit = stage == "fit" && !spec.trainer().skip_test();
  if (test_after_fit) DTRAIN_RETURN_IF_ERROR(LoadTestWeights());
  if (test_after_fit || stage == "test") DTRAIN_RETURN_IF_ERROR(evaluation.Run(EvalKind::kTest));
  if (stage == "predict") DTRAIN_RETURN_IF_ERROR(PredictionLoop(context).Run());
  context.SetPhase("done");
  return absl::OkStatus();
}

absl::Status Trainer::Run() {
  state_.run_start = Now();
  state_.submitted =
      options_.submitted == absl::InfinitePast() ? state_.run_start : options_.submitted;
  state_.phases.Set("placement", state_.run_start - state_.submitted);
  state_.phase = "setup";
  callbacks_.Progress();
  absl::Status status = RunStages();
  if (workers_->cancelled()) status = absl::CancelledError("cancelled by request");
  callbacks_.RunEnd(status);
  return status;
}

}  // namespace dtrain
