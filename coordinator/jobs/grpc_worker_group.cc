#include "coordinator/jobs/grpc_worker_group.h"

#include <algorithm>
#include <map>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/distributed_sampler.h"
#include "common/packed_batch_results.h"
#include "common/setup_request.h"
#include "common/status_macros.h"
#include "dtrain/v1/worker.grpc.pb.h"

namespace dtrain {

GrpcWorkerGroup::GrpcWorkerGroup(std::string job_id, std::vector<v1::WorkerInfo> workers,
                                 absl::Duration setup_timeout, absl::Duration step_timeout)
    : job_id_(job_id),
      setup_timeout_(setup_timeout),
      step_timeout_(step_timeout),
      workers_(std::move(job_id), std::move(workers)) {}

absl::StatusOr<GroupSetup> GrpcWorkerGroup::Setup(const v1::JobSpec& spec,
                                                  const SetupContext& context,
                                                  bool clear_stale_runs) {
  const int n = workers_.size();
  world_ = context.world_size;
  if (clear_stale_runs) {
    // Teardown of this job id is a no-op on a worker that does not hold it.
    DTRAIN_RETURN_IF_ERROR(workers_.OnEvery(
        "teardown of the run before the coordinator restarted",
        [&](int i, grpc::ClientContext* call) {
          v1::TeardownRequest stale;
          stale.set_job_id(job_id_);
          v1::TeardownResponse response;
          return workers_.stub(i).Teardown(call, stale, &response);
        },
        kTeardownTimeout));
  }
  const v1::SetupRequest request = MakeSetupRequest(spec, context);
  std::vector<v1::SetupResponse> responses(n);
  DTRAIN_RETURN_IF_ERROR(workers_.OnEvery(
      "setup",
      [&](int i, grpc::ClientContext* call) {
        return workers_.stub(i).Setup(call, request, &responses[i]);
      },
      setup_timeout_ + absl::Seconds(30)));

  GroupSetup setup;
  setup.world_size = world_;
  // The collectives' data plane: the ranks choose it together, so every worker names the same.
  int64_t group_ms = 0;
  std::map<std::string, std::vector<std::string>> workers_by_note;
  for (int i = 0; i < n; ++i) {
    group_ms = std::max(group_ms, responses[i].group_formation_ms());
    const std::string& note = responses[i].collective_plane_note();
    if (!note.empty()) workers_by_note[note].push_back(workers_.info(i).name());
  }
  std::vector<std::string> notes;
  for (const auto& [note, names] : workers_by_note) {
    notes.push_back(absl::StrCat(absl::StrJoin(names, ", "), ": ", note));
  }
  if (!responses.empty()) {
    setup.collective_plane = responses[0].collective_plane();
    for (const v1::HyperParameter& h : responses[0].hyper_parameters()) {
      setup.hyper_parameters.emplace_back(h.name(), h.yaml());
    }
    setup.optimization = responses[0].optimization();
    for (const v1::PlateauMonitor& m : responses[0].plateau_monitors()) {
      setup.plateau_monitors.emplace_back(m.monitor(), m.strict());
    }
  }
  // Older workers neither expand a sampler nor pack results, and workers of another deal would
  // give ranks overlapping shards: they are sent lists, dealt here.
  for (size_t i = 0; i < responses.size(); ++i) {
    const std::string& deal = responses[i].sampler_deal();
    if (deal == kSamplerDeal) continue;
    setup.other_deals.push_back(deal.empty() ? absl::StrCat("worker '", workers_.info(i).name(),
                                                            "' deals no batches (an older build)")
                                             : absl::StrCat("worker '", workers_.info(i).name(),
                                                            "' deals by '", deal, "'"));
  }
  setup.sampled_work = !responses.empty() && setup.other_deals.empty();
  setup.plane_notes = absl::StrJoin(notes, "; ");
  setup.group_formation = absl::Milliseconds(group_ms);

  std::vector<std::vector<int>> ranks_of_worker(n);
  setup.ranks.assign(world_, "");
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
      setup.ranks[r.rank()] = absl::StrCat("rank ", r.rank(), " on '", workers_.info(i).name(),
                                           "' (node ", r.node_rank(), ", local ", r.local_rank(),
                                           r.cpus().empty() ? "" : ", cpus ", r.cpus(), ")");
    }
  }
  workers_.SetRanks(std::move(ranks_of_worker));
  for (int i = 0; i < n; ++i) setup.workers.push_back(workers_.Describe(i));
  for (const v1::SplitInfo& s : responses[0].splits()) {
    setup.split_sizes[s.name()] = s.size();
    if (s.streamed()) setup.streamed_splits.insert(s.name());
  }
  return setup;
}

std::vector<v1::StepRequest> GrpcWorkerGroup::StepRequests(const std::string& split,
                                                           const RankBatches& batches,
                                                           int64_t first, int64_t count) const {
  std::vector<v1::StepRequest> requests(workers_.size());
  for (int i = 0; i < workers_.size(); ++i) {
    requests[i].set_job_id(job_id_);
    for (int rank : workers_.ranks(i)) {
      v1::LocalWork* work = requests[i].add_work();
      work->set_first_batch_idx(first);
      const auto& mine = batches[rank];
      const int64_t end = std::min<int64_t>(first + count, static_cast<int64_t>(mine.size()));
      for (int64_t b = first; b < end; ++b) {
        v1::IndexBatch* batch = work->add_index_batches();
        batch->set_split(split);
        batch->mutable_indices()->Add(mine[b].begin(), mine[b].end());
      }
    }
  }
  return requests;
}

std::vector<v1::StepRequest> GrpcWorkerGroup::SampledRequests(const TrainCall& call) const {
  std::vector<v1::StepRequest> requests(workers_.size());
  for (int i = 0; i < workers_.size(); ++i) {
    requests[i].set_job_id(job_id_);
    for (size_t local = 0; local < workers_.ranks(i).size(); ++local) {
      v1::LocalWork* work = requests[i].add_work();
      work->set_first_batch_idx(call.first);
      v1::SampledBatches* sampled = work->mutable_sampled();
      sampled->set_split("train");
      sampled->set_samples(call.sampling.samples);
      sampled->set_shuffle(call.sampling.shuffle);
      sampled->set_seed(call.sampling.seed);
      sampled->set_batch_size(call.sampling.batch_size);
      sampled->set_batch_count(call.count);
      sampled->set_deal(kSamplerDeal);
    }
    requests[i].set_packed_results(true);
  }
  return requests;
}

namespace {

// A packed answer's batches (PackedBatchResults), as ScalarsOf reads a BatchResult.
void AddPackedScalars(const v1::PackedBatchResults& packed, std::vector<BatchScalars>* out) {
  const int names = packed.scalar_names_size();
  const int rates = packed.rate_names_size();
  out->reserve(out->size() + packed.sizes_size());
  ForEachPackedBatch(packed, [&](const PackedBatch& p) {
    BatchScalars& batch = out->emplace_back();
    batch.size = p.size;
    for (int j = 0; j < names; ++j) batch.scalars.emplace(packed.scalar_names(j), p.scalars[j]);
    batch.optimizer_stepped = p.optimizer_stepped;
    if (!p.optimizer_stepped) return;
    for (int j = 0; j < rates; ++j) {
      batch.learning_rates.emplace(packed.rate_names(j), p.rates[j]);
    }
  });
}

BatchScalars ScalarsOf(const v1::BatchResult& batch) {
  BatchScalars out;
  out.size = batch.size();
  for (const auto& [name, value] : batch.scalars()) out.scalars.emplace(name, value);
  for (const auto& [name, l] : batch.logged()) {
    out.logged[name] = LoggedValue{.value = l.value(),
                                   .local_value = l.local_value(),
                                   .on_step = l.on_step(),
                                   .on_epoch = l.on_epoch(),
                                   .reduce_fx = l.reduce_fx(),
                                   .weight = l.batch_size(),
                                   .prog_bar = l.prog_bar()};
  }
  out.optimizer_stepped = batch.optimizer_stepped();
  out.learning_rates.insert(batch.learning_rates().begin(), batch.learning_rates().end());
  return out;
}

}  // namespace

absl::Status GrpcWorkerGroup::NoTrainingInFlight(const std::string& what) const {
  if (training_.empty()) return absl::OkStatus();
  // The workers would run it after the training they hold: a loop's mistake, said loudly.
  return absl::InternalError(
      absl::StrCat(what, " asked while ", training_.size(), " training call(s) are unfinished"));
}

absl::StatusOr<TrainResult> GrpcWorkerGroup::Train(const TrainCall& call) {
  DTRAIN_RETURN_IF_ERROR(NoTrainingInFlight("a training call (not pipelined)"));
  StartTrain(call);
  return FinishTrain();
}

void GrpcWorkerGroup::StartTrain(const TrainCall& call) {
  auto sent = std::make_unique<TrainInFlight>();
  sent->first = call.first;
  sent->count = call.count;
  // The loop leaves the batches unlisted exactly when Setup said the workers deal them.
  sent->requests = call.batches == nullptr
                       ? SampledRequests(call)
                       : StepRequests("train", *call.batches, call.first, call.count);
  for (v1::StepRequest& request : sent->requests) {
    request.set_epoch(call.epoch);
    request.set_end_of_epoch(call.end_of_epoch);
    request.set_total_steps(call.total_steps);
    request.mutable_monitored()->insert(call.monitored.begin(), call.monitored.end());
    request.set_pipelined(!training_.empty());
  }
  sent->responses.resize(workers_.size());
  TrainInFlight* s = sent.get();
  // A pipelined call runs after the one ahead of it, which has its own step_timeout.
  const absl::Duration timeout = training_.empty() ? step_timeout_ : 2 * step_timeout_;
  sent->calls = workers_.Start(
      "training_step",
      [this, s](int i, grpc::ClientContext* context, ParallelCalls::Done done) {
        workers_.stub(i).async()->TrainingStep(context, &s->requests[i], &s->responses[i],
                                               std::move(done));
      },
      timeout);
  training_.push_back(std::move(sent));
}

absl::StatusOr<TrainResult> GrpcWorkerGroup::FinishTrain() {
  if (training_.empty()) return absl::InternalError("FinishTrain without a started call");
  std::unique_ptr<TrainInFlight> sent = std::move(training_.front());
  training_.pop_front();
  absl::Status status = workers_.Finish(std::move(sent->calls));
  if (!status.ok()) {
    // The calls sent after it continue from where it failed: none of them may run.
    AbandonTrain();
    return status;
  }
  TrainResult result;
  for (size_t i = 0; i < sent->responses.size(); ++i) {
    for (const v1::LocalResult& local : sent->responses[i].results()) {
      if (local.rank() < 0 || local.rank() >= world_) continue;
      RankTrainResult& r = result.ranks.emplace_back();
      r.rank = local.rank();
      r.global_step = local.global_step();
      r.step_seconds = local.step_seconds();
      r.gradient_wait_seconds = local.gradient_wait_seconds();
      r.data_wait_seconds = local.data_wait_seconds();
      r.data_skipped = local.data_skipped();
      if (local.has_core_wait_seconds()) r.core_wait_seconds = local.core_wait_seconds();
      const v1::StepPhases& phases = local.phases();
      r.phases = {phases.data_seconds(), phases.forward_seconds(), phases.backward_seconds(),
                  phases.averaging_seconds(), phases.optimizer_seconds()};
      if (local.has_packed()) {
        if (absl::Status packed = CheckPackedBatchResults(local, sent->first, sent->count);
            !packed.ok()) {
          AbandonTrain();
          return absl::InternalError(absl::StrCat(
              "worker '", workers_.info(i).name(), "' answered rank ", local.rank(), ": ",
              packed.message(), " (a worker of another build than the coordinator's?)"));
        }
        AddPackedScalars(local.packed(), &r.batches);
      }
      for (const v1::BatchResult& batch : local.batches()) r.batches.push_back(ScalarsOf(batch));
    }
  }
  std::sort(result.ranks.begin(), result.ranks.end(),
            [](const RankTrainResult& a, const RankTrainResult& b) { return a.rank < b.rank; });
  return result;
}

void GrpcWorkerGroup::AbandonTrain() {
  for (auto& sent : training_) RunWorkers::Stop(sent->calls);
  while (!training_.empty()) {
    workers_.Finish(std::move(training_.front()->calls)).IgnoreError();
    training_.pop_front();
  }
}

absl::StatusOr<EvalResult> GrpcWorkerGroup::Evaluate(EvalKind kind, const RankBatches& batches) {
  DTRAIN_RETURN_IF_ERROR(NoTrainingInFlight("an evaluation"));
  const bool test = kind == EvalKind::kTest;
  const int n = workers_.size();
  int64_t most = 0;
  for (const auto& mine : batches) most = std::max<int64_t>(most, mine.size());
  std::vector<v1::StepRequest> requests = StepRequests(test ? "test" : "val", batches, 0, most);
  for (v1::StepRequest& request : requests) request.set_sanity_check(kind == EvalKind::kSanity);
  std::vector<v1::StepResponse> responses(n);
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
      step_timeout_));
  EvalResult result;
  result.ranks.resize(world_);
  for (int i = 0; i < n; ++i) {
    const std::vector<int>& ranks = workers_.ranks(i);
    for (int local = 0;
         local < responses[i].results_size() && local < static_cast<int>(ranks.size()); ++local) {
      for (const v1::BatchResult& batch : responses[i].results(local).batches()) {
        result.ranks[ranks[local]].push_back(ScalarsOf(batch));
      }
    }
  }
  return result;
}

absl::StatusOr<PredictResult> GrpcWorkerGroup::Predict(const PredictCall& call) {
  DTRAIN_RETURN_IF_ERROR(NoTrainingInFlight("a predict call"));
  const int n = workers_.size();
  std::vector<v1::StepRequest> requests =
      StepRequests(call.split, *call.batches, call.first, call.count);
  for (v1::StepRequest& request : requests) request.set_return_outputs(true);
  std::vector<v1::StepResponse> responses(n);
  DTRAIN_RETURN_IF_ERROR(workers_.OnEveryAsync(
      "predict_step",
      [&](int i, grpc::ClientContext* context, ParallelCalls::Done done) {
        workers_.stub(i).async()->PredictStep(context, &requests[i], &responses[i],
                                              std::move(done));
      },
      step_timeout_));
  PredictResult result;
  result.ranks.resize(world_);
  for (int i = 0; i < n; ++i) {
    const std::vector<int>& ranks = workers_.ranks(i);
    for (int local = 0;
         local < responses[i].results_size() && local < static_cast<int>(ranks.size()); ++local) {
      auto& out = result.ranks[ranks[local]];
      for (const v1::BatchResult& batch : responses[i].results(local).batches()) {
        PredictedBatch& predicted = out.emplace_back();
        predicted.kept.assign(batch.kept_rows().begin(), batch.kept_rows().end());
        predicted.output_type = batch.output_type();
        std::map<std::string, HostTensor>& outputs = predicted.outputs;
        for (const auto& [name, proto] : batch.tensors()) {
          // A prediction missing from predictions.pt would shift what follows: refused whole.
          absl::StatusOr<HostTensor> tensor = FromProto(proto);
          if (!tensor.ok()) {
            return absl::DataLossError(absl::StrCat("rank ", ranks[local], " predict batch ",
                                                    batch.batch_idx(), " output '", name,
                                                    "': ", tensor.status().message()));
          }
          outputs.emplace(name, *std::move(tensor));
        }
      }
    }
  }
  return result;
}

absl::StatusOr<SavedCheckpoint> GrpcWorkerGroup::Save(const SaveCall& call) {
  DTRAIN_RETURN_IF_ERROR(NoTrainingInFlight("a checkpoint save"));
  v1::SaveCheckpointRequest request;
  request.set_job_id(job_id_);
  request.set_name(call.name);
  request.set_epoch(call.epoch);
  for (const std::string& name : call.remove) request.add_remove(name);
  request.set_job_spec_json(call.spec_json);
  request.set_total_steps(call.total_steps);
  request.mutable_monitored()->insert(call.monitored.begin(), call.monitored.end());
  for (const v1::CallbackState& state : call.callbacks) *request.add_callbacks() = state;
  std::vector<v1::SaveCheckpointResponse> responses(workers_.size());
  DTRAIN_RETURN_IF_ERROR(workers_.OnEvery(
      "save_checkpoint",
      [&](int i, grpc::ClientContext* context) {
        return workers_.stub(i).SaveCheckpoint(context, request, &responses[i]);
      },
      step_timeout_));
  SavedCheckpoint saved;
  for (const v1::SaveCheckpointResponse& r : responses) {
    if (!absl::c_linear_search(r.written(), true)) continue;
    saved.written = true;
    saved.digest = r.digest();
    saved.bytes = r.bytes();
  }
  return saved;
}

absl::StatusOr<LoadedCheckpoint> GrpcWorkerGroup::Load(const std::string& path) {
  DTRAIN_RETURN_IF_ERROR(NoTrainingInFlight("a checkpoint load"));
  std::vector<v1::LoadCheckpointResponse> answers(workers_.size());
  v1::LoadCheckpointRequest load;
  load.set_job_id(job_id_);
  load.set_path(path);
  DTRAIN_RETURN_IF_ERROR(workers_.OnEvery(
      "load_checkpoint",
      [&](int i, grpc::ClientContext* context) {
        return workers_.stub(i).LoadCheckpoint(context, load, &answers[i]);
      },
      step_timeout_));
  LoadedCheckpoint loaded;
  loaded.global_step = answers[0].global_step();
  loaded.epoch = answers[0].epoch();
  loaded.callbacks.assign(answers[0].callbacks().begin(), answers[0].callbacks().end());
  return loaded;
}

absl::StatusOr<bool> GrpcWorkerGroup::AnyRankDecides(const std::vector<bool>& by_rank) {
  DTRAIN_RETURN_IF_ERROR(NoTrainingInFlight("a decision"));
  std::vector<v1::DecisionResponse> decisions(workers_.size());
  DTRAIN_RETURN_IF_ERROR(workers_.OnEvery(
      "reduce_boolean_decision",
      [&](int i, grpc::ClientContext* context) {
        v1::DecisionRequest request;
        request.set_job_id(job_id_);
        request.set_all(false);
        for (int rank : workers_.ranks(i)) {
          request.add_decisions(rank < static_cast<int>(by_rank.size()) && by_rank[rank]);
        }
        return workers_.stub(i).ReduceBooleanDecision(context, request, &decisions[i]);
      },
      step_timeout_));
  return decisions[0].decision();
}

}  // namespace dtrain
