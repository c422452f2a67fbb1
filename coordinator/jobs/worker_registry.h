// WorkerRegistry: the worker daemons the coordinator knows, their addresses and devices, and
// whether their heartbeats still arrive. Jobs are placed on ALIVE workers; a worker silent for
// longer than the heartbeat timeout is LOST, and forgotten after ten timeouts. A worker that
// is stopping says so (DRAINING): it is placed on nothing, and its job lets it go.
//
// Thread-safety: all methods may be called from any thread.
#pragma once

#include <deque>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/job_spec.h"
#include "common/key_page.h"
#include "dtrain/v1/workers.pb.h"

namespace dtrain {

class WorkerRegistry final {
 public:
  // `max_heartbeats_per_second` (0: no limit) caps the workers' heartbeats as a whole: past
  // interval x rate workers, the interval handed out grows in proportion, and the timeout with
  // it (as Nomad scales its heartbeat TTLs), so 10,000 idle workers do not take a core.
  explicit WorkerRegistry(absl::Duration heartbeat_timeout,
                          absl::Duration heartbeat_interval = absl::Seconds(1),
                          double max_heartbeats_per_second = 0)
      : base_timeout_(heartbeat_timeout),
        base_interval_(heartbeat_interval),
        max_rate_(max_heartbeats_per_second) {}

  // INVALID_ARGUMENT naming the field (workers.proto lists the checks). `same_host`, when
  // given, gets the other workers of its host (RegisterWorkerResponse.same_host).
  absl::Status Register(const v1::WorkerInfo& worker, absl::Time now,
                        google::protobuf::RepeatedPtrField<v1::WorkerInfo>* same_host = nullptr);
  // Also tells a worker that reports a job which is not (or no longer) assigned to it to drop
  // it (response->abandoned_job). INVALID_ARGUMENT for an empty name or incarnation 0;
  // NOT_FOUND when no worker of that name and incarnation is registered.
  absl::Status Heartbeat(const v1::WorkerHeartbeatRequest& request, absl::Time now,
                         v1::WorkerHeartbeatResponse* response);
  // A call to the worker could not connect (it died, or its port is gone): it is not placed
  // again until it heartbeats after this.
  void MarkUnreachable(const std::string& name);
  // `job_id` ran under a coordinator before this one (restored from its database): a worker
  // that still reports it is told to drop it, unless the job is placed on it again.
  void MarkEnded(const std::string& job_id);
  // Reserves free workers for `job_id`: ALIVE, running nothing by their last heartbeat and
  // placed on no job, in name order, skipping `exclude`; at most `max_count`, and none when
  // fewer than `min_count` are free. Choosing and reserving happen under one lock, so two jobs
  // never get one worker. A worker stays the job's (ListWorkers' assigned_job_id) until Release.
  // Only workers offering every (kind, name) plugin of `plugins` qualify.
  std::vector<v1::WorkerInfo> Reserve(
      const std::string& job_id, int min_count, int max_count, const std::set<std::string>& exclude,
      absl::Time now, const std::vector<std::pair<std::string, std::string>>& plugins = {});
  // The plugins the registered workers (but the lost) offer, for NormalizeJobSpec.
  OfferedPlugins Offered() const;
  // `name` is no longer the job's (its job ended, or went on without it); a heartbeat that
  // still reports the job is told to drop it.
  void Release(const std::string& name);
  // As Release, for a worker whose teardown of the job succeeded: it runs nothing now, so it is
  // free for the next job (or a dry run) at once, not only after its next heartbeat says so,
  // and a heartbeat still reporting the job (sent before the teardown) does not make it busy.
  void ReleaseTornDown(const std::string& name);
  // OK for an unknown name; INVALID_ARGUMENT for an empty name or incarnation 0; NOT_FOUND when
  // another incarnation holds the name.
  absl::Status Unregister(const v1::UnregisterWorkerRequest& request);
  // Those of `names` that said they are stopping (DRAINING), or that stopped cleanly
  // (unregistered) while a job was placed on them, in the order given.
  std::vector<std::string> Draining(const std::vector<std::string>& names) const;
  // By name, with state and last_seen_ms_ago as of `now`; with `page`, the workers it holds.
  std::vector<v1::WorkerInfo> List(absl::Time now, KeyPage* page = nullptr) const;
  // A worker that is LOST while placed on a job, and why, for that job's run to stop calling it.
  struct LostWorker {
    std::string name;
    std::string job_id;
    std::string why;  // "no heartbeat for 5.02s (timeout 5s)"
  };
  // Marks silent workers LOST and forgets long-lost ones. Returns every LOST worker still
  // placed on a job, on every tick and not only when it goes LOST: a run that starts a call at
  // the moment it is told still hears of the loss at the next tick.
  std::vector<LostWorker> Tick(absl::Time now);
  // How often workers heartbeat now, and how long a silent one stays ALIVE: both grow with the
  // number of workers past max_heartbeats_per_second.
  absl::Duration heartbeat_interval() const;
  absl::Duration heartbeat_timeout() const;

 private:
  void RememberEndedLocked(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Duration IntervalLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Duration TimeoutLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  struct Entry {
    v1::WorkerInfo info;
    absl::Time last_seen;
    bool draining = false;  // for the rest of this incarnation, LOST or not
    // The job this worker last tore down: a heartbeat reporting it was sent before the
    // teardown, and does not make the worker busy again. Until a heartbeat reports anything
    // else, the worker is reserved for that job again (a requeued job keeps its id), or it
    // registers.
    std::string torn_down_job;
  };
  // The workers registered with `self`'s host but `self`, not LOST, with their cores.
  void SameHostLocked(const Entry& self,
                      google::protobuf::RepeatedPtrField<v1::WorkerInfo>* out) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const absl::Duration base_timeout_;
  const absl::Duration base_interval_;
  const double max_rate_;
  mutable absl::Mutex mu_;
  std::map<std::string, Entry> workers_ ABSL_GUARDED_BY(mu_);
  // host -> the names in workers_ registered from it, so that a worker placing itself reads
  // its host's workers without walking the whole table at every heartbeat.
  std::map<std::string, std::set<std::string>> by_host_ ABSL_GUARDED_BY(mu_);
  // Removes `it` from workers_ and by_host_; returns the next entry.
  std::map<std::string, Entry>::iterator EraseLocked(std::map<std::string, Entry>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::map<std::string, std::string> assigned_ ABSL_GUARDED_BY(mu_);  // worker -> job
  // Jobs released from their workers (the newest kRememberedJobs), for abandoned_job.
  static constexpr size_t kRememberedJobs = 4096;
  std::set<std::string> ended_ ABSL_GUARDED_BY(mu_);
  // Workers that unregistered while placed on a job, until the job lets them go: a stop so
  // quick that the job never saw the worker drain is still a drain, not a lost worker.
  std::set<std::string> stopped_while_placed_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> ended_order_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dtrain
