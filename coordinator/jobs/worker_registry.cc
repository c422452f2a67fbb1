#include "coordinator/jobs/worker_registry.h"

#include <algorithm>

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "common/plugin_catalog.h"

namespace dtrain {
namespace {

constexpr size_t kMaxFieldBytes = 256;
constexpr int kMaxThreads = 4096;
constexpr size_t kMostPluginDescriptionBytes = 1024;
// A job id is "<spec name>-<n>", the name at most 128 bytes.
constexpr size_t kMostJobIdBytes = 256;

absl::Status CheckField(const std::string& field, const std::string& value) {
  if (value.empty()) return absl::InvalidArgumentError(absl::StrCat("worker ", field, " is empty"));
  if (value.size() > kMaxFieldBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker ", field, " is ", value.size(), " bytes; at most 256"));
  }
  return absl::OkStatus();
}

// A heartbeat's or goodbye's name and incarnation: those a registration was accepted with.
absl::Status CheckIdentity(const std::string& name, uint64_t incarnation) {
  if (name.empty()) return absl::InvalidArgumentError("worker name is empty");
  if (incarnation == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker '", name, "': incarnation must be the non-zero random id it registered with"));
  }
  return absl::OkStatus();
}

// A cpu list as a worker reports it: short, and only what Linux's list syntax uses. Workers
// parse their peers' lists themselves; the coordinator only keeps them from carrying junk.
absl::Status CheckCpuListField(const std::string& field, const std::string& value) {
  if (value.size() > kMaxFieldBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker ", field, " is ", value.size(), " bytes; at most 256"));
  }
  for (char c : value) {
    if (!absl::ascii_isdigit(c) && c != ',' && c != '-') {
      return absl::InvalidArgumentError(
          absl::StrCat("worker ", field, " '", value, "' is not a cpu list such as 0-3,6"));
    }
  }
  return absl::OkStatus();
}

// The most workers of one host a response lists: more would be a misconfigured host name.
constexpr int kMaxSameHost = 256;

}  // namespace

void WorkerRegistry::SameHostLocked(const Entry& self,
                                    google::protobuf::RepeatedPtrField<v1::WorkerInfo>* out) const {
  out->Clear();
  // Only a worker placing itself reads the list: the others' heartbeats stay O(1) (every
  // heartbeat of a 10,000-worker cluster walking the table would be O(n^2) a second).
  if (!self.info.cpus_auto()) return;
  auto host = by_host_.find(self.info.host());
  if (host == by_host_.end()) return;
  for (const std::string& name : host->second) {
    if (out->size() >= kMaxSameHost) break;
    auto it = workers_.find(name);
    if (it == workers_.end()) continue;
    const Entry& e = it->second;
    if (&e == &self || e.info.state() == v1::WorkerInfo::LOST) continue;
    v1::WorkerInfo* peer = out->Add();
    peer->set_name(e.info.name());
    peer->set_host(e.info.host());
    peer->set_state(e.info.state());
    peer->set_allowed_cpus(e.info.allowed_cpus());
    peer->set_cpus(e.info.cpus());
    peer->set_threads(e.info.threads());
    peer->set_cpus_auto(e.info.cpus_auto());
  }
}

absl::Status WorkerRegistry::Register(
    const v1::WorkerInfo& worker, absl::Time now,
    google::protobuf::RepeatedPtrField<v1::WorkerInfo>* same_host) {
  for (const auto& [field, value] :
       {std::pair<std::string, const std::string*>{"name", &worker.name()},
        {"address", &worker.address()},
        {"host", &worker.host()}}) {
    if (absl::Status s = CheckField(field, *value); !s.ok()) return s;
  }
  if (worker.devices() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker devices must be at least 1, got ", worker.devices()));
  }
  if (worker.incarnation() == 0) {
    return absl::InvalidArgumentError("worker incarnation must be a non-zero random id");
  }
  if (absl::Status s = CheckCpuListField("allowed_cpus", worker.allowed_cpus()); !s.ok()) return s;
  if (absl::Status s = CheckCpuListField("cpus", worker.cpus()); !s.ok()) return s;
  if (worker.threads() < 0 || worker.threads() > kMaxThreads) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker threads must be in [0, ", kMaxThreads, "], got ", worker.threads()));
  }
  if (worker.plugins_size() > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("a worker offers at most 256 plugins, got ", worker.plugins_size()));
  }
  for (const v1::Plugin& p : worker.plugins()) {
    if (!absl::c_linear_search(PluginKindNames(), p.kind())) {
      return absl::InvalidArgumentError(absl::StrCat("plugin '", p.name(), "' has kind '", p.kind(),
                                                     "'; use ",
                                                     absl::StrJoin(PluginKindNames(), ", ")));
    }
    if (!IsPluginName(p.name())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "plugin name '", p.name(), "' must be 1 to 64 characters of a-z, 0-9, '_', '-', '.'"));
    }
    // Kept for every ListWorkers: a line for a person to read, not a document.
    if (p.description().size() > kMostPluginDescriptionBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("plugin '", p.name(), "' has a description of ", p.description().size(),
                       " bytes; at most ", kMostPluginDescriptionBytes));
    }
  }
  absl::MutexLock lock(&mu_);
  auto known = workers_.find(worker.name());
  const bool again =
      known != workers_.end() && known->second.info.incarnation() == worker.incarnation();
  LogInfo(absl::StrCat("worker '", worker.name(), "' registered",
                       again                     ? " again"
                       : known != workers_.end() ? " (a new process)"
                                                 : ""),
          {{"worker", worker.name()},
           {"address", worker.address()},
           {"host", worker.host()},
           {"devices", worker.devices()}});
  stopped_while_placed_.erase(worker.name());
  if (known != workers_.end() && known->second.info.host() != worker.host()) {
    auto old_host = by_host_.find(known->second.info.host());
    if (old_host != by_host_.end()) {
      old_host->second.erase(worker.name());
      if (old_host->second.empty()) by_host_.erase(old_host);
    }
  }
  by_host_[worker.host()].insert(worker.name());
  Entry& e = workers_[worker.name()];
  e.info.set_name(worker.name());
  e.info.set_address(worker.address());
  e.info.set_host(worker.host());
  e.info.set_devices(worker.devices());
  e.info.set_incarnation(worker.incarnation());
  *e.info.mutable_plugins() = worker.plugins();
  e.info.set_allowed_cpus(worker.allowed_cpus());
  e.info.set_cpus(worker.cpus());
  e.info.set_threads(worker.threads());
  e.info.set_cpus_auto(worker.cpus_auto());
  e.info.set_state(v1::WorkerInfo::ALIVE);
  e.draining = false;
  e.info.clear_job_id();
  e.torn_down_job.clear();
  e.info.set_registered_unix_ms(absl::ToUnixMillis(now));
  e.last_seen = now;
  if (same_host != nullptr) SameHostLocked(e, same_host);
  return absl::OkStatus();
}

void WorkerRegistry::MarkUnreachable(const std::string& name) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(name);
  if (it != workers_.end() && it->second.info.state() == v1::WorkerInfo::ALIVE) {
    it->second.info.set_state(v1::WorkerInfo::UNREACHABLE);
  }
}

void WorkerRegistry::RememberEndedLocked(const std::string& job_id) {
  if (!ended_.insert(job_id).second) return;
  ended_order_.push_back(job_id);
  if (ended_order_.size() > kRememberedJobs) {
    ended_.erase(ended_order_.front());
    ended_order_.pop_front();
  }
}

void WorkerRegistry::MarkEnded(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  RememberEndedLocked(job_id);
}

std::vector<v1::WorkerInfo> WorkerRegistry::Reserve(
    const std::string& job_id, int min_count, int max_count, const std::set<std::string>& exclude,
    absl::Time now, const std::vector<std::pair<std::string, std::string>>& plugins) {
  auto offers_all = [&](const v1::WorkerInfo& info) {
    for (const auto& [kind, plugin] : plugins) {
      bool found = false;
      for (const v1::Plugin& p : info.plugins())
        found = found || (p.kind() == kind && p.name() == plugin);
      if (!found) return false;
    }
    return true;
  };
  absl::MutexLock lock(&mu_);
  std::vector<v1::WorkerInfo> chosen;
  for (const auto& [name, e] : workers_) {
    if (static_cast<int>(chosen.size()) >= max_count) break;
    if (e.info.state() != v1::WorkerInfo::ALIVE || !e.info.job_id().empty() ||
        assigned_.count(name) > 0 || exclude.count(name) > 0 || !offers_all(e.info)) {
      continue;
    }
    chosen.push_back(e.info);
    chosen.back().set_last_seen_ms_ago(absl::ToInt64Milliseconds(now - e.last_seen));
  }
  if (static_cast<int>(chosen.size()) < min_count) return {};
  for (v1::WorkerInfo& w : chosen) {
    assigned_[w.name()] = job_id;
    w.set_assigned_job_id(job_id);
    // Placed again on the job it tore down (a requeued job keeps its id): its heartbeats of
    // that job count again.
    auto it = workers_.find(w.name());
    if (it != workers_.end() && it->second.torn_down_job == job_id)
      it->second.torn_down_job.clear();
  }
  return chosen;
}

OfferedPlugins WorkerRegistry::Offered() const {
  absl::MutexLock lock(&mu_);
  OfferedPlugins offered;
  for (const auto& [name, e] : workers_) {
    if (e.info.state() == v1::WorkerInfo::LOST) continue;
    for (const v1::Plugin& p : e.info.plugins()) offered[{p.kind(), p.name()}].push_back(name);
  }
  return offered;
}

void WorkerRegistry::Release(const std::string& name) {
  absl::MutexLock lock(&mu_);
  stopped_while_placed_.erase(name);
  auto it = assigned_.find(name);
  if (it == assigned_.end()) return;
  RememberEndedLocked(it->second);
  assigned_.erase(it);
}

void WorkerRegistry::ReleaseTornDown(const std::string& name) {
  absl::MutexLock lock(&mu_);
  stopped_while_placed_.erase(name);
  auto it = assigned_.find(name);
  if (it == assigned_.end()) return;
  if (auto w = workers_.find(name); w != workers_.end()) {
    if (w->second.info.job_id() == it->second) w->second.info.clear_job_id();
    w->second.torn_down_job = it->second;
  }
  RememberEndedLocked(it->second);
  assigned_.erase(it);
}

absl::Status WorkerRegistry::Heartbeat(const v1::WorkerHeartbeatRequest& request, absl::Time now,
                                       v1::WorkerHeartbeatResponse* response) {
  if (absl::Status s = CheckIdentity(request.name(), request.incarnation()); !s.ok()) return s;
  if (absl::Status s = CheckCpuListField("cpus", request.cpus()); !s.ok()) return s;
  if (request.threads() < 0 || request.threads() > kMaxThreads) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker threads must be in [0, ", kMaxThreads, "], got ", request.threads()));
  }
  if (request.job_id().size() > kMostJobIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat("heartbeat job_id is ", request.job_id().size(),
                                                   " bytes; no job id is longer than ",
                                                   kMostJobIdBytes));
  }
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(request.name());
  if (it == workers_.end() || it->second.info.incarnation() != request.incarnation()) {
    return absl::NotFoundError(absl::StrCat(
        "worker '", request.name(), "' (this incarnation) is not registered; register again"));
  }
  Entry& e = it->second;
  e.last_seen = now;
  e.info.set_cpus(request.cpus());
  e.info.set_threads(request.threads());
  SameHostLocked(e, response->mutable_same_host());
  response->set_heartbeat_interval_ms(absl::ToInt64Milliseconds(IntervalLocked()));
  response->set_heartbeat_timeout_ms(absl::ToInt64Milliseconds(TimeoutLocked()));
  if (request.draining() && !e.draining) {
    LogInfo(absl::StrCat("worker '", request.name(),
                         "' is stopping (draining): it gets no new "
                         "job, and its job lets it go after a checkpoint"),
            {{"worker", request.name()}, {"job", request.job_id()}});
  }
  if (e.info.state() == v1::WorkerInfo::LOST) {
    LogInfo(absl::StrCat("worker '", request.name(), "' heartbeats again"),
            {{"worker", request.name()}});
  }
  e.draining = e.draining || request.draining();
  e.info.set_state(e.draining ? v1::WorkerInfo::DRAINING : v1::WorkerInfo::ALIVE);
  if (!e.torn_down_job.empty() && request.job_id() == e.torn_down_job) {
    e.info.clear_job_id();  // stale: sent before the teardown that ReleaseTornDown records
  } else {
    e.torn_down_job.clear();  // the stale window is over: the worker reports something else
    e.info.set_job_id(request.job_id());
  }
  if (e.draining && !request.job_id().empty()) {
    auto assigned = assigned_.find(request.name());
    response->set_release_pending(assigned != assigned_.end() &&
                                  assigned->second == request.job_id());
  }
  // Only jobs this coordinator ran and released: a job a client set up on the worker directly
  // (the Worker API is public) is not the coordinator's to end.
  if (!request.job_id().empty() && ended_.count(request.job_id()) > 0) {
    auto assigned = assigned_.find(request.name());
    if (assigned == assigned_.end() || assigned->second != request.job_id()) {
      response->set_abandoned_job(request.job_id());
    }
  }
  return absl::OkStatus();
}

std::vector<std::string> WorkerRegistry::Draining(const std::vector<std::string>& names) const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> draining;
  for (const std::string& name : names) {
    auto it = workers_.find(name);
    if ((it != workers_.end() && it->second.draining) || stopped_while_placed_.count(name) > 0) {
      draining.push_back(name);
    }
  }
  return draining;
}

absl::Status WorkerRegistry::Unregister(const v1::UnregisterWorkerRequest& request) {
  if (absl::Status s = CheckIdentity(request.name(), request.incarnation()); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(request.name());
  if (it == workers_.end()) return absl::OkStatus();
  if (it->second.info.incarnation() != request.incarnation()) {
    return absl::NotFoundError(
        absl::StrCat("worker '", request.name(), "' is registered by another incarnation"));
  }
  LogInfo(absl::StrCat("worker '", request.name(), "' unregistered (it stopped)"),
          {{"worker", request.name()}});
  if (assigned_.count(request.name()) > 0) stopped_while_placed_.insert(request.name());
  EraseLocked(it);
  return absl::OkStatus();
}

std::map<std::string, WorkerRegistry::Entry>::iterator WorkerRegistry::EraseLocked(
    std::map<std::string, Entry>::iterator it) {
  auto host = by_host_.find(it->second.info.host());
  if (host != by_host_.end()) {
    host->second.erase(it->first);
    if (host->second.empty()) by_host_.erase(host);
  }
  return workers_.erase(it);
}

std::vector<v1::WorkerInfo> WorkerRegistry::List(absl::Time now, KeyPage* page) const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::WorkerInfo> out;
  auto it =
      page != nullptr && page->resumes() ? workers_.upper_bound(page->after()) : workers_.begin();
  for (; it != workers_.end(); ++it) {
    const auto& [name, e] = *it;
    v1::WorkerInfo info = e.info;
    info.set_last_seen_ms_ago(absl::ToInt64Milliseconds(now - e.last_seen));
    if (auto assigned = assigned_.find(name); assigned != assigned_.end()) {
      info.set_assigned_job_id(assigned->second);
    }
    if (page != nullptr && !page->Take(name, info.ByteSizeLong() + 8)) break;
    out.push_back(std::move(info));
  }
  return out;
}

absl::Duration WorkerRegistry::IntervalLocked() const {
  if (max_rate_ <= 0) return base_interval_;
  return std::max(base_interval_, absl::Seconds(static_cast<double>(workers_.size()) / max_rate_));
}

absl::Duration WorkerRegistry::TimeoutLocked() const {
  return base_timeout_ * absl::FDivDuration(IntervalLocked(), base_interval_);
}

absl::Duration WorkerRegistry::heartbeat_interval() const {
  absl::MutexLock lock(&mu_);
  return IntervalLocked();
}

absl::Duration WorkerRegistry::heartbeat_timeout() const {
  absl::MutexLock lock(&mu_);
  return TimeoutLocked();
}

std::vector<WorkerRegistry::LostWorker> WorkerRegistry::Tick(absl::Time now) {
  absl::MutexLock lock(&mu_);
  const absl::Duration timeout = TimeoutLocked();
  std::vector<LostWorker> lost_placed;
  for (auto it = workers_.begin(); it != workers_.end();) {
    const absl::Duration silent = now - it->second.last_seen;
    const std::string& name = it->first;
    if (silent > 10 * timeout) {
      LogInfo(absl::StrCat("worker '", name, "' forgotten: silent for ",
                           absl::FormatDuration(absl::Trunc(silent, absl::Seconds(1)))),
              {{"worker", name}});
      it = EraseLocked(it);
      continue;
    }
    if (silent > timeout && it->second.info.state() != v1::WorkerInfo::LOST) {
      LogWarning(absl::StrCat("worker '", name, "' lost: no heartbeat for ",
                              absl::FormatDuration(absl::Trunc(silent, absl::Milliseconds(1))),
                              " (timeout ", absl::FormatDuration(timeout),
                              "); no job is placed on it until it heartbeats again"),
                 {{"worker", name}, {"job", it->second.info.job_id()}});
      it->second.info.set_state(v1::WorkerInfo::LOST);
    }
    if (it->second.info.state() == v1::WorkerInfo::LOST) {
      auto placed = assigned_.find(name);
      if (placed != assigned_.end()) {
        lost_placed.push_back(
            {name, placed->second,
             absl::StrCat("no heartbeat for ",
                          absl::FormatDuration(absl::Trunc(silent, absl::Milliseconds(10))),
                          " (timeout ", absl::FormatDuration(timeout), ")")});
      }
    }
    ++it;
  }
  return lost_placed;
}

}  // namespace dtrain
