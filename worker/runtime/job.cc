#include "worker/runtime/job.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <optional>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/types.h>

#include "absl/strings/str_cat.h"
#include "common/distributed_sampler.h"
#include "common/job_settings.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "common/tensor.h"
#include "common/thread_schedstat.h"
#include "common/tls_credentials.h"
#include "worker/collectives/collective_plane.h"
#include "worker/model/batch_tree.h"
#include "worker/model/model_thread_scope.h"
#include "worker/model/model_zoo.h"
#include "worker/model/tensor_convert.h"
#include "worker/model/torch_status.h"
#include "worker/runtime/cpu_affinity.h"
#include "worker/runtime/local_work.h"
#include "worker/runtime/optimizer_choice.h"
#include "worker/runtime/registered_plugins.h"

namespace dtrain {
namespace {

// How long Gloo may take to connect the peers before the ranks fall back to the coordinator's
// collectives (collective_backend auto) or the job fails (gloo, shm): on a network where they
// can reach each other it takes milliseconds.
constexpr absl::Duration kPeerConnectTimeout = absl::Seconds(30);

absl::StatusOr<LightningModule> LoadModel(const v1::ModelSpec& spec, uint64_t seed) {
  switch (spec.source_case()) {
    case v1::ModelSpec::kBuiltin:
      return BuiltinModel(spec.builtin(), seed);
    case v1::ModelSpec::kTorchscript:
      return LightningModule::Load(spec.torchscript());
    default:
      return absl::InvalidArgumentError(
          "model: give builtin (mlp, cnn) or torchscript (a file saved with torch.jit.save)");
  }
}

// Puts the CPU random generator back as it was, when `active`, whatever the scope's outcome:
// Lightning's isolate_rng around its sanity check.
class RandomStateRestorer {
 public:
  explicit RandomStateRestorer(bool active) {
    if (!active) return;
    at::Generator g = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(g.mutex());
    state_ = g.get_state();
  }
  ~RandomStateRestorer() {
    if (!state_.has_value()) return;
    at::Generator g = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(g.mutex());
    try {
      g.set_state(*state_);
    } catch (const c10::Error&) {  // the state it gave back: not expected to fail
    }
  }
  RandomStateRestorer(const RandomStateRestorer&) = delete;
  RandomStateRestorer& operator=(const RandomStateRestorer&) = delete;

 private:
  std::optional<at::Tensor> state_;
};

// Prefixes a status's message with the request field it concerns.
absl::Status InField(const std::string& field, const absl::Status& status) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(field, ": ", status.message()));
}

// Scalars as numbers, the rest as tensors when asked for; predict's outputs are all tensors, so
// that predictions.pt keeps their shapes and types.
// A prediction that cannot travel (a dtype the wire lacks) fails the step, naming it, rather
// than leaving a hole in predictions.pt; other outputs that cannot are left out.
absl::Status AddOutputs(const StepOutput& out, bool with_tensors, bool all_tensors,
                        v1::BatchResult* result) {
  for (const auto& [key, value] : out) {
    if (!all_tensors && value.numel() == 1 && (value.is_floating_point() || value.dim() == 0)) {
      (*result->mutable_scalars())[key] = ReportedScalar(value);
    } else if (with_tensors) {
      absl::StatusOr<HostTensor> host = FromTorch(value.detach());
      if (host.ok()) {
        ToProto(*host, &(*result->mutable_tensors())[key]);
      } else if (all_tensors) {
        return absl::InvalidArgumentError(absl::StrCat(
            "predict_step's output '", key, "' cannot be sent: ", host.status().message()));
      }
    }
  }
  return absl::OkStatus();
}

// What model code logged during a batch, with Lightning's defaults for self.log: training_step
// logs per step, the other steps and every hook per epoch; a mean weighs each value by its
// batch's size unless the call gave batch_size.
void AddLogged(std::map<std::string, StrategyCollectives::Logged> logged, bool training_step,
               int64_t batch_size, v1::BatchResult* r) {
  for (const auto& [name, l] : logged) {
    v1::LoggedValue& v = (*r->mutable_logged())[name];
    v.set_value(l.value);
    v.set_local_value(l.local_value);
    v.set_on_step(l.options.on_step.value_or(training_step));
    v.set_on_epoch(l.options.on_epoch.value_or(!training_step));
    v.set_reduce_fx(l.options.reduce_fx);
    v.set_batch_size(static_cast<double>(l.options.batch_size.value_or(batch_size)));
    v.set_prog_bar(l.options.prog_bar);
  }
}

// What an epoch-end hook logged joins the epoch's last batch (dropped when there is none), as
// one value of weight 1 unless it gave batch_size.
void AddHookLogged(Accelerator& a, v1::LocalResult* result) {
  std::map<std::string, StrategyCollectives::Logged> logged = a.TakeLogged();
  if (result->batches_size() == 0) return;
  AddLogged(std::move(logged), /*training_step=*/false, 1,
            result->mutable_batches(result->batches_size() - 1));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Job>> Job::Setup(const v1::SetupRequest& request,
                                                const WorkerIdentity& identity,
                                                CallCanceller* cancel) {
  // Everything is checked before joining the group, so a bad request never leaves the other
  // ranks waiting for a member that will not come. The spec's own rules were applied by the
  // service (NormalizeSetupRequest); what is left is whether this worker has what it names.
  const v1::JobSpec& spec = request.spec();
  const v1::TrainerConfig& t = spec.trainer();
  DTRAIN_RETURN_IF_ERROR(InField("spec.trainer.precision",
                                 PluginRegistry::Global().FindPrecision(t.precision()).status()));
  absl::StatusOr<PluginRegistry::StrategyEntry> strategy_entry = ResolveStrategy(t.strategy());
  if (!strategy_entry.ok()) return InField("spec.trainer.strategy", strategy_entry.status());
  const std::string strategy_name = strategy_entry->info.name;
  absl::StatusOr<PluginRegistry::AcceleratorEntry> accelerator_entry =
      PluginRegistry::Global().FindAccelerator(t.accelerator());
  if (!accelerator_entry.ok()) {
    return InField("spec.trainer.accelerator", accelerator_entry.status());
  }
  DTRAIN_RETURN_IF_ERROR(InField("spec.trainer.accelerator",
                                 ResolveAccelerator(accelerator_entry->planned_as).status()));
  absl::StatusOr<PluginRegistry::CheckpointIOEntry> io_entry =
      PluginRegistry::Global().FindCheckpointIO(spec.checkpoint().checkpoint_io());
  if (!io_entry.ok()) return InField("spec.checkpoint.checkpoint_io", io_entry.status());
  absl::StatusOr<std::unique_ptr<CheckpointIO>> checkpoint_io = io_entry->make();
  if (!checkpoint_io.ok()) return InField("spec.checkpoint.checkpoint_io", checkpoint_io.status());
  absl::StatusOr<ClipAlgorithm> clip = ParseClipAlgorithm(t.gradient_clip_algorithm());
  if (!clip.ok()) return InField("spec.trainer.gradient_clip_algorithm", clip.status());
  DTRAIN_RETURN_IF_ERROR(CheckSpecOptimizer(spec));

  std::unique_ptr<Job> job(new Job());
  job->id_ = request.job_id();
  job->accumulate_ = t.accumulate_grad_batches();
  job->clip_val_ = t.gradient_clip_val();
  job->clip_algorithm_ = *clip;
  DataLoadOptions data_options;
  data_options.seed = spec.seed_everything();
  data_options.cancelled = &job->cancelled_;
  // The job is not the worker's yet, so its Setup's cancel (a stop, a Teardown, the call's own)
  // comes through `cancel`.
  data_options.load_cancelled = cancel != nullptr ? cancel->flag() : nullptr;
  data_options.fetcher.artifact = identity.fetch_artifact;
  absl::StatusOr<std::unique_ptr<Dataset>> data = Dataset::Load(spec.data(), data_options);
  if (!data.ok()) return InField("spec.data", data.status());
  job->data_ = std::move(*data);
  absl::StatusOr<LightningModule> model = LoadModel(spec.model(), spec.seed_everything());
  if (!model.ok()) return InField("spec.model", model.status());
  DTRAIN_ASSIGN_OR_RETURN(OptimizerChoice choice,
                          ChooseOptimizer(spec, model->optimization_json()));
  job->optimization_ = choice.description;
  torch::manual_seed(spec.seed_everything());

  std::unique_ptr<CollectiveBackend> backend;
  if (strategy_entry->traits.distributed) {
    const v1::GroupSpec& g = request.group();
    if (g.world_size() < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "strategy ", strategy_name, " needs group.world_size >= 1 (the job's ranks)"));
    }
    ProcessGroupOptions options;
    options.cancel = cancel;
    options.group = g.group().empty() ? request.job_id() : g.group();
    options.world_size = g.world_size();
    // The job's own token, or none: a rank never presents its daemon's admin token.
    options.token = g.token();
    options.only_given_token = true;
    // Nothing in a rank reads the member list: ranks are named by the coordinator, peers found
    // through its store.
    options.member_list = false;
    options.host = identity.host;
    options.name = request.worker_name().empty() ? identity.name : request.worker_name();
    options.order_key =
        absl::StrCat(options.name, "/", absl::Dec(request.spawn_index(), absl::kZeroPad4));
    if (g.register_timeout_ms() > 0)
      options.register_timeout = absl::Milliseconds(g.register_timeout_ms());
    if (t.collective_timeout_ms() > 0) {
      options.collective_timeout = absl::Milliseconds(t.collective_timeout_ms());
    }
    // The worker's own --coordinator whenever it has one: whoever sends a Setup cannot point
    // the job's token (and the rank's connections) at another address. A worker whose
    // --coordinator is empty (driven by a program, not a cluster) uses the request's.
    const std::string address =
        identity.coordinator.empty() ? g.coordinator() : identity.coordinator;
    if (address.empty()) {
      return absl::InvalidArgumentError(
          "group.coordinator is empty and the worker has no --coordinator");
    }
    const absl::Time joining = absl::Now();
    DTRAIN_ASSIGN_OR_RETURN(std::unique_ptr<ProcessGroup> group,
                            ProcessGroup::Join(address, options));
    // The group's: the spec's when it sets one, else the coordinator's --collective_timeout,
    // as the coordinator's own collectives use it.
    const int64_t group_timeout_ms = group->assignment().collective_timeout_ms();
    const absl::Duration timeout =
        group_timeout_ms > 0 ? absl::Milliseconds(group_timeout_ms) : absl::Minutes(10);
    DTRAIN_ASSIGN_OR_RETURN(
        CollectivePlane plane,
        ConnectCollectivePlane(t.collective_backend(), address, std::move(group), timeout,
                               std::min(timeout, kPeerConnectTimeout),
                               identity.trusted_network || !ClientTlsEnabled(), identity.host));
    backend = std::move(plane.backend);
    job->plane_ = plane.name;
    job->plane_note_ = plane.note;
    job->group_formation_ = absl::Now() - joining;
  } else if (request.group().world_size() > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "strategy ", strategy_name, " runs in one process; group.world_size must be 1"));
  }
  StrategyOptions strategy;
  strategy.name = strategy_name;
  strategy.devices = t.devices();
  strategy.bucket_bytes = BucketBytes(t.bucket_cap_mb());
  strategy.split_optimizer_step = !t.has_split_optimizer_step() || t.split_optimizer_step();
  strategy.gradients_read_before_step = t.gradient_clip_val() > 0;
  DTRAIN_ASSIGN_OR_RETURN(job->accelerator_, Accelerator::Make(t.accelerator(), t.precision(),
                                                               strategy, std::move(backend)));
  const ModelThreadScope scope(job->accelerator_->root_device());
  DTRAIN_RETURN_IF_ERROR(scope.status());
  DTRAIN_RETURN_IF_ERROR(
      job->accelerator_->Setup(std::move(*model), choice.optimizer, choice.schedule));
  if (choice.recipe.has_value()) {
    DTRAIN_RETURN_IF_ERROR(
        InField("spec.model",
                job->accelerator_->UseSchedulers(choice.recipe->schedulers(), choice.optimizer)));
    const std::string described = job->accelerator_->schedulers()->Describe();
    if (!described.empty()) absl::StrAppend(&job->optimization_, ", ", described);
  }
  if (job->accelerator_->strategy().splits_optimizer_step()) {
    absl::StrAppend(&job->optimization_, "; its step split between the ",
                    job->accelerator_->strategy().world_size(), " ranks",
                    job->accelerator_->strategy().mean_only_in_own_part_between_steps()
                        ? ", the mean between a call's steps in each rank's own part only"
                        : ", the mean on every rank at every step (.grad may be read between)");
  }
  job->accelerator_->strategy().SetCheckpointIO(std::move(*checkpoint_io));
  // A streamed split's rank reads its own chunk of each epoch (worker/data/epoch_plan.h).
  job->data_->SetRank(job->accelerator_->strategy().global_rank(),
                      job->accelerator_->strategy().world_size());
  job->cpus_ = FormatCpuList(identity.cpus);
  const v1::CheckpointConfig& c = spec.checkpoint();
  job->storage_options_ = StorageOptions(c.storage_options().begin(), c.storage_options().end());
  // Local: PrepareSetup (worker/service/setup_paths.h) took its "worker:" mark off.
  if (!c.dirpath().empty() && job->accelerator_->strategy().should_rank_save_checkpoint()) {
    DTRAIN_RETURN_IF_ERROR(
        InField("spec.checkpoint.dirpath", PrepareCheckpointDirectory(c.dirpath())));
  }
  DTRAIN_RETURN_IF_ERROR(job->accelerator_->PreDispatch());
  return job;
}

absl::Status Job::Dispatch() {
  if (dispatched_) return absl::OkStatus();
  dispatched_ = true;
  return accelerator_->Dispatch();
}

absl::Status Job::EndTraining() {
  if (!train_started_ || train_ended_) return absl::OkStatus();
  train_ended_ = true;
  DTRAIN_RETURN_IF_ERROR(accelerator_->CallHook("on_train_end"));
  return accelerator_->OnTrainEnd();
}

namespace {

std::vector<int64_t> FirstIndices(int64_t size, int batch) {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < std::min<int64_t>(size, batch); ++i) out.push_back(i);
  return out;
}

}  // namespace

absl::StatusOr<v1::DryRunResponse> Job::DryRun(const v1::DryRunRequest& request,
                                               const WorkerIdentity& identity) {
  v1::SetupRequest setup = request.setup();
  setup.set_job_id("dry-run");
  setup.mutable_spec()->mutable_trainer()->set_strategy("single_device");
  setup.mutable_spec()->mutable_trainer()->set_devices(1);
  setup.mutable_spec()->mutable_checkpoint()->clear_dirpath();
  setup.clear_group();
  const int default_batch_size = JobSpecDefaults().data().batch_size();
  if (request.batch_size() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch_size must be >= 0 (0: ", default_batch_size, "), got ", request.batch_size()));
  }
  const int batch_size = request.batch_size() > 0 ? request.batch_size() : default_batch_size;
  DTRAIN_ASSIGN_OR_RETURN(std::unique_ptr<Job> job, Setup(setup, identity));
  v1::DryRunResponse report;
  report.set_worker(identity.name);
  v1::SetupResponse described;
  job->Describe(&described);
  *report.mutable_splits() = described.splits();
  report.set_parameter_count(described.parameter_count());
  Accelerator& a = *job->accelerator_;
  const ModelThreadScope scope(a.root_device());
  DTRAIN_RETURN_IF_ERROR(scope.status());
  torch::NoGradGuard no_grad;
  std::map<std::string, int64_t> sizes;
  for (const v1::SplitInfo& split : described.splits()) sizes[split.name()] = split.size();
  if (sizes.count("train") > 0) {
    DTRAIN_ASSIGN_OR_RETURN(c10::IValue batch,
                            job->data_->Batch("train", FirstIndices(sizes["train"], batch_size)));
    report.set_batch(DescribeBatch(batch));
    a.SetTrainingMode(true);
    DTRAIN_ASSIGN_OR_RETURN(torch::Tensor loss, a.TrainingStep(batch, 0));
    report.set_loss(ReportedScalar(a.TrainingStepEnd(loss)));
    for (const std::string& key : a.model().last_training_keys()) {
      report.add_training_step_keys(key);
    }
  }
  if (sizes.count("val") > 0 && a.model().HasMethod("validation_step")) {
    DTRAIN_ASSIGN_OR_RETURN(c10::IValue batch,
                            job->data_->Batch("val", FirstIndices(sizes["val"], batch_size)));
    if (report.batch().empty()) report.set_batch(DescribeBatch(batch));
    a.SetTrainingMode(false);
    DTRAIN_ASSIGN_OR_RETURN(StepOutput out, a.ValidationStep(batch, 0));
    for (const auto& [key, value] : out) report.add_validation_step_keys(key);
  }
  (void)job->accelerator_->Teardown();
  return report;
}

v1::RankInfo Job::rank_info() const {
  v1::RankInfo info;
  Strategy& s = accelerator_->strategy();
  info.set_rank(s.global_rank());
  info.set_local_rank(s.local_rank());
  info.set_node_rank(s.node_rank());
  info.set_world_size(s.world_size());
  info.set_pid(getpid());
  info.set_cpus(cpus_);
  return info;
}

void Job::Describe(v1::SetupResponse* response) const {
  *response->add_ranks() = rank_info();
  if (data_ != nullptr) {
    for (const auto& [name, size] : data_->Splits()) {
      v1::SplitInfo* split = response->add_splits();
      split->set_name(name);
      split->set_size(size);
      split->set_streamed(data_->Streamed(name));
    }
  }
  int64_t count = 0;
  for (const torch::Tensor& p : accelerator_->model().Parameters()) count += p.numel();
  response->set_parameter_count(count);
  response->set_root_device(accelerator_->root_device().str());
  response->set_parameter_dtype(c10::toString(accelerator_->precision().ParameterDType()));
  response->set_collective_plane(plane_);
  response->set_collective_plane_note(plane_note_);
  response->set_group_formation_ms(absl::ToInt64Milliseconds(group_formation_));
  response->set_optimization(optimization_);
  response->set_sampler_deal(kSamplerDeal);
  if (const LrSchedulers* schedulers = accelerator_->schedulers(); schedulers != nullptr) {
    for (const LrSchedulers::Monitor& m : schedulers->PlateauMonitors()) {
      v1::PlateauMonitor* monitor = response->add_plateau_monitors();
      monitor->set_monitor(m.name);
      monitor->set_strict(m.strict);
    }
  }
  LightningModule::HyperParametersText hyper_parameters =
      accelerator_->model().HyperParametersYaml();
  for (auto& [name, yaml] : hyper_parameters.yaml) {
    v1::HyperParameter* h = response->add_hyper_parameters();
    h->set_name(name);
    h->set_yaml(std::move(yaml));
  }
  // Every rank loads the same module: one says it, naming the job.
  if (accelerator_->strategy().global_rank() == 0) {
    for (const std::string& why : hyper_parameters.left_out) {
      LogWarning(absl::StrCat("job ", id_, ": ", why));
    }
  }
}

int Job::BatchCount(const v1::LocalWork& work) {
  // A sampled count is checked by DealSampled against the epoch's batches before it is used.
  return static_cast<int>(
      std::min<int64_t>(LocalWorkBatches(work), std::numeric_limits<int>::max()));
}

absl::Status Job::DealSampled(const v1::LocalWork& work, int64_t epoch) {
  DealingRank dealer;
  for (const auto& [name, size] : data_->Splits()) {
    if (name == "train") dealer.train_size = size;
  }
  dealer.streamed = data_->Streamed("train");
  dealer.world = accelerator_->strategy().world_size();
  dealer.rank = accelerator_->strategy().global_rank();
  return sampled_.Deal(work, epoch, dealer);
}

absl::StatusOr<c10::IValue> Job::BatchAt(const v1::LocalWork& work, int i, int64_t epoch,
                                         std::vector<int64_t>* kept) const {
  if (work.batches_size() > 0) {
    std::vector<c10::IValue> items;
    for (int t = 0; t < work.batches(i).tensors_size(); ++t) {
      absl::StatusOr<HostTensor> host = FromProto(work.batches(i).tensors(t));
      if (!host.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("batch ", i, " tensor ", t, ": ", host.status().message()));
      }
      DTRAIN_ASSIGN_OR_RETURN(torch::Tensor tensor, ToTorch(*host));
      items.emplace_back(std::move(tensor));
    }
    if (items.empty())
      return absl::InvalidArgumentError(absl::StrCat("batch ", i, " has no tensors"));
    if (items.size() == 1) return items.front();
    return c10::ivalue::Tuple::create(std::move(items));
  }
  if (work.index_batches_size() == 0 && work.has_sampled()) {
    return data_->Batch(work.sampled().split(), sampled_.Batch(work, i), epoch, kept);
  }
  const v1::IndexBatch& b = work.index_batches(i);
  // Each index becomes a row before the model sees any: a batch past the spec's largest
  // (data.batch_size's and data.eval_batch_size's bound) is no call a coordinator makes.
  const int64_t most_rows = MostBatchRows();
  if (b.indices_size() > most_rows) {
    return absl::InvalidArgumentError(absl::StrCat("index batch ", i, " holds ", b.indices_size(),
                                                   " indices; a batch holds at most ", most_rows,
                                                   " (data.batch_size's bound)"));
  }
  return data_->Batch(b.split(), {b.indices().begin(), b.indices().end()}, epoch, kept);
}

absl::StatusOr<v1::LocalResult> Job::Train(const v1::LocalWork& work, int64_t epoch,
                                           bool end_of_epoch, int64_t total_steps,
                                           const std::map<std::string, double>& monitored,
                                           std::vector<CallbackStateDict> callbacks) {
  // This thread's CUDA work lands on the rank's device, not GPU 0, and its TorchScript runs as
  // the device wants it (worker/model/model_thread_scope.h).
  const ModelThreadScope scope(accelerator_->root_device());
  DTRAIN_RETURN_IF_ERROR(scope.status());
  DTRAIN_RETURN_IF_ERROR(DealSampled(work, epoch));
  if (BatchCount(work) == 0) return absl::InvalidArgumentError("the step carries no batches");
  if (total_steps < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("total_steps must be >= 0 (0: not known), got ", total_steps));
  }
  ClearCancel();
  Accelerator& a = *accelerator_;
  if (total_steps > 0) DTRAIN_RETURN_IF_ERROR(a.SetRunLength(total_steps));
  DTRAIN_RETURN_IF_ERROR(Dispatch());
  if (!train_started_) {
    a.SetTrainingMode(true);
    DTRAIN_RETURN_IF_ERROR(a.CallHook("on_train_start"));
    DTRAIN_RETURN_IF_ERROR(a.OnTrainStart());
    train_started_ = true;
    train_ended_ = false;
  }
  // The last epoch's validation decides ReduceLROnPlateau before this epoch's first step.
  if (!monitored.empty()) DTRAIN_RETURN_IF_ERROR(a.StepPlateaus(epoch - 1, monitored));
  if (epoch != train_epoch_) {
    a.SetTrainingMode(true);
    DTRAIN_RETURN_IF_ERROR(a.CallHook("on_train_epoch_start"));
    train_epoch_ = epoch;
  }
  a.SetEpoch(epoch);
  a.SetTrainingMode(true);
  // What the start hooks logged joins the call's first batch, with a hook's defaults.
  std::map<std::string, StrategyCollectives::Logged> hook_logged = a.TakeLogged();
  v1::LocalResult result;
  result.set_rank(a.strategy().global_rank());
  // A monotonic clock, so that the phases fit in the step time even across a clock step.
  using Clock = std::chrono::steady_clock;
  const Clock::time_point began = Clock::now();
  // Inside the step's span, so that the core's wait is a part of step_seconds.
  const absl::StatusOr<ThreadSchedstat> sched_before = ThisThreadSchedstat();
  const absl::Duration waited_before = a.strategy().gradient_wait();
  const absl::Duration averaged_before = a.averaging_time();
  const absl::Duration averaged_in_step_before = a.strategy().averaging_in_step();
  const double data_wait_before = data_->wait_seconds();
  // The step's phases, for the job log's profile: a clock read between them (well under a
  // microsecond a batch against a step's hundreds of microseconds at least).
  Clock::duration data{}, forward{}, backward{}, optimizer{};
  for (int i = 0; i < BatchCount(work); ++i) {
    if (cancelled_) return absl::CancelledError(absl::StrCat("job ", id_, " was cancelled"));
    Clock::time_point mark = Clock::now();
    auto phase_ends = [&mark](Clock::duration& phase) {
      const Clock::time_point now = Clock::now();
      phase += now - mark;
      mark = now;
    };
    DTRAIN_ASSIGN_OR_RETURN(c10::IValue batch, BatchAt(work, i, epoch));
    const int64_t batch_idx = work.first_batch_idx() + i;
    DTRAIN_RETURN_IF_ERROR(a.OnTrainBatchStart(batch_idx));
    // Before the step: what the step does with its batch does not change the batch's weight.
    const int64_t batch_size = BatchSize(batch);
    phase_ends(data);
    DTRAIN_ASSIGN_OR_RETURN(torch::Tensor out, a.TrainingStep(batch, batch_idx));
    torch::Tensor loss = a.TrainingStepEnd(out);
    phase_ends(forward);
    const bool closes_epoch = end_of_epoch && i + 1 == BatchCount(work);
    const bool should_accumulate = (accumulated_ + 1) % accumulate_ != 0 && !closes_epoch;
    // As Lightning: each loss of an accumulation window counts 1/accumulate, so the window's
    // gradient is the mean over its batches.
    DTRAIN_RETURN_IF_ERROR(
        a.Backward(accumulate_ > 1 ? loss / accumulate_ : loss, should_accumulate));
    phase_ends(backward);
    ++accumulated_;
    v1::BatchResult* r = result.add_batches();
    r->set_batch_idx(batch_idx);
    r->set_size(batch_size);
    (*r->mutable_scalars())["loss"] = ReportedScalar(loss);
    for (const auto& [name, value] : a.model().TakeTrainingExtras()) {
      (*r->mutable_scalars())[name] = value;
    }
    AddLogged(a.TakeLogged(), /*training_step=*/true, r->size(), r);
    if (!hook_logged.empty()) AddLogged(std::exchange(hook_logged, {}), false, 1, r);
    if (should_accumulate) continue;
    mark = Clock::now();  // the results above are bookkeeping
    if (clip_val_ > 0) {
      DTRAIN_ASSIGN_OR_RETURN(double norm, a.ClipGradients(clip_val_, clip_algorithm_));
      (*r->mutable_scalars())["grad_norm"] = norm;
    }
    for (const auto& [name, lr] : a.MonitoredRates()) (*r->mutable_learning_rates())[name] = lr;
    // Between this step and the next backward only the next training_step runs, which the
    // strategy checks itself; after a call's last step hooks, validation or a checkpoint may.
    a.strategy().SetGradientsUnreadAfterNextStep(i + 1 < BatchCount(work));
    DTRAIN_ASSIGN_OR_RETURN(bool stepped, a.OptimizerStep());
    if (stepped) DTRAIN_RETURN_IF_ERROR(a.PostOptimizerStep());
    // As Lightning: the schedulers step even when 16-mixed skipped the optimizer's step.
    DTRAIN_RETURN_IF_ERROR(a.AfterOptimizerWindow(batch_idx, closes_epoch));
    a.OptimizerZeroGrad();
    a.UpdateGlobalStep();
    phase_ends(optimizer);
    accumulated_ = 0;
    r->set_optimizer_stepped(true);
    r->set_step_skipped(!stepped);
  }
  auto seconds = [](Clock::duration d) { return std::chrono::duration<double>(d).count(); };
  if (sched_before.ok()) {
    if (absl::StatusOr<ThreadSchedstat> after = ThisThreadSchedstat(); after.ok()) {
      const int64_t waited = std::max<int64_t>(0, after->run_queue_ns - sched_before->run_queue_ns);
      result.set_core_wait_seconds(static_cast<double>(waited) / 1e9);
    }
  }
  result.set_step_seconds(seconds(Clock::now() - began));
  result.set_data_wait_seconds(data_->wait_seconds() - data_wait_before);
  result.set_data_skipped(data_->skipped());
  result.set_gradient_wait_seconds(
      absl::ToDoubleSeconds(a.strategy().gradient_wait() - waited_before));
  // Backward's time holds the averaging after autograd (Accelerator::Backward runs both), the
  // optimizer's that of a split step (which averages as it steps).
  const double averaging = absl::ToDoubleSeconds(a.averaging_time() - averaged_before);
  const double averaging_in_step =
      absl::ToDoubleSeconds(a.strategy().averaging_in_step() - averaged_in_step_before);
  v1::StepPhases& phases = *result.mutable_phases();
  phases.set_data_seconds(seconds(data));
  phases.set_forward_seconds(seconds(forward));
  phases.set_backward_seconds(std::max(0.0, seconds(backward) - averaging));
  phases.set_averaging_seconds(averaging + averaging_in_step);
  phases.set_optimizer_seconds(std::max(0.0, seconds(optimizer) - averaging_in_step));
  if (end_of_epoch) {
    DTRAIN_RETURN_IF_ERROR(a.CallHook("on_train_epoch_end"));
    AddHookLogged(a, &result);
  }
  result.set_global_step(a.progress().global_step);
  result.set_lr(a.strategy().learning_rate());
  if (a.precision().scaler() != nullptr) result.set_loss_scale(a.precision().scaler()->scale());
  return result;
}

absl::StatusOr<v1::LocalResult> Job::Evaluate(StepKind kind, const v1::LocalWork& work,
                                              bool return_outputs, bool sanity_check) {
  const ModelThreadScope scope(accelerator_->root_device());
  DTRAIN_RETURN_IF_ERROR(scope.status());
  // No batches is fine here: evaluation shards are not padded, so with fewer samples than
  // ranks some ranks have nothing to evaluate.
  ClearCancel();
  RandomStateRestorer restorer(sanity_check);
  Accelerator& a = *accelerator_;
  if (kind == StepKind::kTraining) {
    return absl::InvalidArgumentError("Evaluate runs validation, test or predict steps");
  }
  if (work.batches_size() == 0 && work.index_batches_size() == 0 && work.has_sampled()) {
    return absl::InvalidArgumentError(
        "sampled batches are for training calls; evaluation lists its batches' indices");
  }
  DTRAIN_RETURN_IF_ERROR(Dispatch());
  // Fit is over when testing or predicting begins: Lightning's on_train_end comes first.
  if (kind != StepKind::kValidation) DTRAIN_RETURN_IF_ERROR(EndTraining());
  a.SetTrainingMode(false);
  const std::string hook_stage = kind == StepKind::kValidation ? "validation"
                                 : kind == StepKind::kTest     ? "test"
                                                               : "predict";
  // Lightning's order: on_<stage>_start, on_<stage>_epoch_start, the steps, on_<stage>_epoch_end,
  // on_<stage>_end; the model's hook, then the accelerator's (and strategy's).
  DTRAIN_RETURN_IF_ERROR(a.CallHook(absl::StrCat("on_", hook_stage, "_start")));
  DTRAIN_RETURN_IF_ERROR(kind == StepKind::kValidation ? a.OnValidationStart()
                         : kind == StepKind::kTest     ? a.OnTestStart()
                                                       : a.OnPredictStart());
  DTRAIN_RETURN_IF_ERROR(a.CallHook(absl::StrCat("on_", hook_stage, "_epoch_start")));
  const bool with_tensors = return_outputs || kind == StepKind::kPredict;
  v1::LocalResult result;
  result.set_rank(a.strategy().global_rank());
  for (int i = 0; i < BatchCount(work); ++i) {
    if (cancelled_) return absl::CancelledError(absl::StrCat("job ", id_, " was cancelled"));
    std::vector<int64_t> kept;
    DTRAIN_ASSIGN_OR_RETURN(c10::IValue batch, BatchAt(work, i, 0, &kept));
    const int64_t batch_idx = work.first_batch_idx() + i;
    if (batch.isNone()) {
      // Streamed with on_error: skip, and every sample of the batch was skipped: no step, and a
      // result of no rows so that the batches after it keep their places.
      v1::BatchResult* r = result.add_batches();
      r->set_batch_idx(batch_idx);
      r->set_size(0);
      continue;
    }
    const int64_t batch_size = BatchSize(batch);
    StepOutput out;
    if (kind == StepKind::kValidation) {
      DTRAIN_ASSIGN_OR_RETURN(out, a.ValidationStep(batch, batch_idx));
      out = a.ValidationStepEnd(std::move(out));
    } else if (kind == StepKind::kTest) {
      DTRAIN_ASSIGN_OR_RETURN(out, a.TestStep(batch, batch_idx));
      out = a.TestStepEnd(std::move(out));
    } else {
      DTRAIN_ASSIGN_OR_RETURN(out, a.PredictStep(batch, batch_idx));
    }
    v1::BatchResult* r = result.add_batches();
    r->set_batch_idx(batch_idx);
    r->set_size(batch_size);
    for (int64_t k : kept) r->add_kept_rows(k);
    DTRAIN_RETURN_IF_ERROR(GuardTorch("cannot read the step's outputs", [&]() -> absl::Status {
      DTRAIN_RETURN_IF_ERROR(AddOutputs(out, with_tensors, kind == StepKind::kPredict, r));
      if (kind == StepKind::kPredict)
        r->set_output_type(a.strategy().model().predict_output_type());
      return absl::OkStatus();
    }));
    AddLogged(a.TakeLogged(), /*training_step=*/false, r->size(), r);
  }
  DTRAIN_RETURN_IF_ERROR(a.CallHook(absl::StrCat("on_", hook_stage, "_epoch_end")));
  DTRAIN_RETURN_IF_ERROR(a.CallHook(absl::StrCat("on_", hook_stage, "_end")));
  DTRAIN_RETURN_IF_ERROR(kind == StepKind::kValidation ? a.OnValidationEnd()
                         : kind == StepKind::kTest     ? a.OnTestEnd()
                                                       : a.OnPredictEnd());
  AddHookLogged(a, &result);
  result.set_global_step(a.progress().global_step);
  return result;
}

absl::StatusOr<bool> Job::SaveCheckpoint(const std::string& path, int64_t epoch,
                                         const std::string& job_spec_json, int64_t total_steps,
                                         const std::map<std::string, double>& monitored,
                                         std::vector<CallbackStateDict> callbacks) {
  const ModelThreadScope scope(accelerator_->root_device());
  DTRAIN_RETURN_IF_ERROR(scope.status());
  if (path.empty()) return absl::InvalidArgumentError("checkpoint path is empty");
  if (total_steps < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("total_steps must be >= 0 (0: not known), got ", total_steps));
  }
  if (total_steps > 0) DTRAIN_RETURN_IF_ERROR(accelerator_->SetRunLength(total_steps));
  accelerator_->SetEpoch(epoch);
  if (!monitored.empty()) DTRAIN_RETURN_IF_ERROR(accelerator_->StepPlateaus(epoch, monitored));
  return accelerator_->SaveCheckpoint(path, job_spec_json, storage_options_, std::move(callbacks));
}

absl::StatusOr<TrainingProgress> Job::LoadCheckpoint(const std::string& path) {
  const ModelThreadScope scope(accelerator_->root_device());
  DTRAIN_RETURN_IF_ERROR(scope.status());
  if (path.empty()) return absl::InvalidArgumentError("checkpoint path is empty");
  return accelerator_->LoadCheckpoint(path);
}

absl::Status Job::StateDict(v1::StateDictResponse* response) {
  const ModelThreadScope scope(accelerator_->root_device());
  DTRAIN_RETURN_IF_ERROR(scope.status());
  for (const auto& [name, tensor] : accelerator_->LightningModuleStateDict()) {
    DTRAIN_ASSIGN_OR_RETURN(HostTensor host, FromTorch(tensor));
    ToProto(host, &(*response->mutable_tensors())[name]);
  }
  return absl::OkStatus();
}

void Job::Cancel() {
  cancelled_ = true;
  if (accelerator_ != nullptr) {
    accelerator_->strategy().backend().Interrupt(
        absl::CancelledError(absl::StrCat("job ", id_, " was cancelled")));
  }
}

void Job::ClearCancel() {
  cancelled_ = false;
  accelerator_->strategy().backend().ClearInterrupt();
}

absl::Status Job::Teardown(bool all_ranks) {
  const ModelThreadScope scope(accelerator_->root_device());
  // The Teardown RPC interrupted any step in progress, which has ended: every rank tears down
  // together, so on_train_end's collectives (a model's) and the barrier below are new ones.
  // A rank leaving alone (its worker stops) stays interrupted: its peers may never join them.
  if (all_ranks) accelerator_->strategy().backend().ClearInterrupt();
  // A fit that ended without a test or predict: on_train_end before the group goes. The group
  // is left whatever the hooks say, so the other ranks see a departure.
  absl::Status hook = EndTraining();
  absl::Status post = accelerator_->PostDispatch();
  if (hook.ok()) hook = post;
  if (all_ranks) accelerator_->strategy().TeardownBarrier();
  absl::Status torn = accelerator_->Teardown();
  return hook.ok() ? torn : hook;
}

}  // namespace dtrain
