#include "coordinator/jobs/run_workers.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/channel.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "coordinator/jobs/worker_group.h"

namespace dtrain {

RunWorkers::RunWorkers(std::string job_id, std::vector<v1::WorkerInfo> workers)
    : job_id_(std::move(job_id)), workers_(std::move(workers)) {
  for (const v1::WorkerInfo& w : workers_) {
    stubs_.push_back(v1::Worker::NewStub(ConnectToCoordinator(w.address())));
  }
  ranks_of_worker_.assign(workers_.size(), {});
}

void RunWorkers::SetRanks(std::vector<std::vector<int>> ranks_of_worker) {
  ranks_of_worker_ = std::move(ranks_of_worker);
  ranks_of_worker_.resize(workers_.size());
}

std::string RunWorkers::Describe(int worker) const {
  std::string ranks;
  if (!ranks_of_worker_[worker].empty()) {
    ranks = absl::StrCat(ranks_of_worker_[worker].size() == 1 ? " (rank " : " (ranks ",
                         absl::StrJoin(ranks_of_worker_[worker], ", "), ")");
  }
  return absl::StrCat("worker '", workers_[worker].name(), "'", ranks);
}

void RunWorkers::Cancel() {
  cancelled_ = true;
  calls_.CancelAll();
}

void RunWorkers::MarkLost(const std::string& name, const std::string& why) {
  for (int i = 0; i < size(); ++i) {
    if (workers_[i].name() != name) continue;
    {
      absl::MutexLock lock(&lost_mu_);
      lost_.emplace(i, why);
    }
    // Every tick while the loss lasts, so a call started just as it was marked is cancelled too.
    calls_.CancelAll();
  }
}

absl::Status RunWorkers::LostStatus(const std::string& what) const {
  absl::MutexLock lock(&lost_mu_);
  if (lost_.empty()) return absl::OkStatus();
  const auto& [worker, why] = *lost_.begin();
  return WorkerLostError(what, Describe(worker), why);
}

void RunWorkers::NoteUnreachable(const std::vector<grpc::Status>& results) {
  for (size_t i = 0; i < results.size(); ++i) {
    if (results[i].error_code() == grpc::StatusCode::UNAVAILABLE) {
      unreachable_.insert(static_cast<int>(i));
    }
  }
}

absl::Status RunWorkers::OnEvery(const std::string& what, const Call& call,
                                 absl::Duration timeout) {
  if (cancelled_) return absl::CancelledError("the job was cancelled");
  DTRAIN_RETURN_IF_ERROR(LostStatus(what));
  return Judge(what, calls_.Run(size(), call, kFailureGrace, absl::Now() + timeout));
}

absl::Status RunWorkers::OnEveryAsync(const std::string& what, const AsyncCall& start,
                                      absl::Duration timeout) {
  return Finish(Start(what, start, timeout));
}

RunWorkers::InFlight RunWorkers::Start(const std::string& what, const AsyncCall& start,
                                       absl::Duration timeout) {
  InFlight in_flight;
  in_flight.what = what;
  if (cancelled_) {
    in_flight.refused = absl::CancelledError("the job was cancelled");
  } else {
    in_flight.refused = LostStatus(what);
  }
  if (in_flight.refused.ok()) in_flight.calls = calls_.Start(size(), start, absl::Now() + timeout);
  return in_flight;
}

absl::Status RunWorkers::Finish(InFlight in_flight) {
  if (in_flight.calls == nullptr) return in_flight.refused;
  return Judge(in_flight.what, calls_.Wait(std::move(in_flight.calls), kFailureGrace));
}

void RunWorkers::Stop(InFlight& in_flight) {
  if (in_flight.calls != nullptr) ParallelCalls::Cancel(*in_flight.calls);
}

absl::Status RunWorkers::Judge(const std::string& what, const std::vector<grpc::Status>& results) {
  NoteUnreachable(results);
  if (cancelled_) return absl::CancelledError("the job was cancelled");
  const bool all_ok =
      std::all_of(results.begin(), results.end(), [](const grpc::Status& s) { return s.ok(); });
  // A worker the registry lost is the root cause of whatever failed with it (its peers' group
  // errors, or calls cancelled because of it).
  if (!all_ok) DTRAIN_RETURN_IF_ERROR(LostStatus(what));
  // The root cause first: a call cancelled after another failed is secondary.
  for (const bool skip_cancelled : {true, false}) {
    for (size_t i = 0; i < results.size(); ++i) {
      if (results[i].ok()) continue;
      if (skip_cancelled && results[i].error_code() == grpc::StatusCode::CANCELLED) continue;
      absl::Status s = FromGrpcStatus(results[i]);
      if (s.code() == absl::StatusCode::kUnavailable) {
        return WorkerLostError(what, Describe(i), std::string(s.message()));
      }
      return absl::Status(s.code(),
                          absl::StrCat(what, " failed on ", Describe(i), ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

void RunWorkers::Teardown() {
  if (stubs_.empty()) return;
  // A lost worker is not waited for (a stopped one would take all of kTeardownTimeout); it drops
  // the job itself once it heartbeats again (WorkerRegistry's abandoned_job).
  const std::set<int> lost = Lost();
  // Not through calls_: a cancelled job still tears down.
  ParallelCalls teardown;
  const std::vector<grpc::Status> results = teardown.Run(
      size(),
      [&](int i, grpc::ClientContext* context) {
        if (lost.count(i) > 0) {
          return grpc::Status(grpc::StatusCode::UNAVAILABLE, "lost: not torn down");
        }
        v1::TeardownRequest request;
        request.set_job_id(job_id_);
        request.set_all_ranks(true);
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

std::vector<std::string> RunWorkers::Names(const std::set<int>& workers) const {
  std::vector<std::string> names;
  for (int i : workers) names.push_back(workers_[i].name());
  return names;
}

std::set<int> RunWorkers::Lost() const {
  absl::MutexLock lock(&lost_mu_);
  std::set<int> lost;
  for (const auto& [worker, why] : lost_) lost.insert(worker);
  return lost;
}

std::vector<std::string> RunWorkers::unreachable() const {
  std::set<int> unreachable = Lost();
  unreachable.insert(unreachable_.begin(), unreachable_.end());
  return Names(unreachable);
}

std::vector<std::string> RunWorkers::lost() const {
  std::set<int> lost = Lost();
  lost.insert(unreachable_.begin(), unreachable_.end());
  lost.insert(teardown_failed_.begin(), teardown_failed_.end());
  return Names(lost);
}

}  // namespace dtrain
