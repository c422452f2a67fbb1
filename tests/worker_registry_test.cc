// WorkerRegistry: states as heartbeats arrive, stop and say they are draining; the job placed
// on a worker is listed from placement until it lets the worker go, whatever heartbeats say.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "coordinator/jobs/worker_registry.h"

namespace dtrain {
namespace worker_registry_test {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

v1::WorkerInfo Worker(const std::string& name, uint64_t incarnation) {
  v1::WorkerInfo w;
  w.set_name(name);
  w.set_address(name + ":1");
  w.set_host("h");
  w.set_devices(1);
  w.set_incarnation(incarnation);
  return w;
}

v1::WorkerHeartbeatRequest Beat(const std::string& name, uint64_t incarnation,
                                const std::string& job, bool draining) {
  v1::WorkerHeartbeatRequest r;
  r.set_name(name);
  r.set_incarnation(incarnation);
  r.set_job_id(job);
  r.set_draining(draining);
  return r;
}

v1::WorkerInfo::State StateOf(const WorkerRegistry& registry, const std::string& name,
                              absl::Time now) {
  for (const v1::WorkerInfo& w : registry.List(now)) {
    if (w.name() == name) return w.state();
  }
  return v1::WorkerInfo::STATE_UNSPECIFIED;
}

// A worker placing its steps itself (--cpus=auto) hears of the other workers of its host, with
// their cores, at registration and in every heartbeat's answer: not itself, not other hosts,
// not the lost; a heartbeat updates where its steps run now. A cpu list that is not one is
// refused by name.
TEST(WorkerRegistryTest, SameHostWorkers_WithTheirCores_InRegistrationAndHeartbeatAnswers) {
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  WorkerRegistry registry(absl::Seconds(10));
  v1::WorkerInfo a = Worker("a", 1);
  a.set_allowed_cpus("0-1");
  a.set_cpus("0-1");
  a.set_threads(2);
  a.set_cpus_auto(true);
  google::protobuf::RepeatedPtrField<v1::WorkerInfo> peers;
  ASSERT_TRUE(registry.Register(a, t0, &peers).ok());
  EXPECT_THAT(peers, IsEmpty());
  v1::WorkerInfo other_host = Worker("x", 1);
  other_host.set_host("elsewhere");
  ASSERT_TRUE(registry.Register(other_host, t0).ok());
  v1::WorkerInfo b = Worker("b", 2);
  b.set_allowed_cpus("0-1");
  b.set_cpus_auto(true);
  ASSERT_TRUE(registry.Register(b, t0, &peers).ok());
  ASSERT_EQ(peers.size(), 1);
  EXPECT_EQ(peers[0].name(), "a");
  EXPECT_EQ(peers[0].allowed_cpus(), "0-1");
  EXPECT_EQ(peers[0].cpus(), "0-1");
  EXPECT_TRUE(peers[0].cpus_auto());
  // a moves to core 0 and says so in its next heartbeat; b hears it in its own.
  v1::WorkerHeartbeatRequest beat = Beat("a", 1, "", false);
  beat.set_cpus("0");
  beat.set_threads(1);
  v1::WorkerHeartbeatResponse answer;
  ASSERT_TRUE(registry.Heartbeat(beat, t0, &answer).ok());
  ASSERT_EQ(answer.same_host_size(), 1);
  EXPECT_EQ(answer.same_host(0).name(), "b");
  ASSERT_TRUE(registry.Heartbeat(Beat("b", 2, "", false), t0, &answer).ok());
  ASSERT_EQ(answer.same_host_size(), 1);
  EXPECT_EQ(answer.same_host(0).cpus(), "0");
  EXPECT_EQ(answer.same_host(0).threads(), 1);
  // a falls silent: once LOST its cores are no longer counted as taken.
  ASSERT_TRUE(registry.Heartbeat(Beat("b", 2, "", false), t0 + absl::Seconds(11), &answer).ok());
  registry.Tick(t0 + absl::Seconds(11));
  EXPECT_EQ(StateOf(registry, "a", t0 + absl::Seconds(11)), v1::WorkerInfo::LOST);
  ASSERT_TRUE(registry.Heartbeat(Beat("b", 2, "", false), t0 + absl::Seconds(11), &answer).ok());
  EXPECT_EQ(answer.same_host_size(), 0);
  // A worker pinned by hand does not read the list, and is not sent it.
  ASSERT_TRUE(registry.Register(Worker("d", 4), t0 + absl::Seconds(11), &peers).ok());
  EXPECT_THAT(peers, IsEmpty());
  // Not a cpu list: refused, naming the field.
  v1::WorkerInfo bad = Worker("c", 3);
  bad.set_allowed_cpus("0-1; rm -rf /");
  absl::Status refused = registry.Register(bad, t0);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.message()), ::testing::HasSubstr("allowed_cpus"));
  v1::WorkerHeartbeatRequest bad_beat = Beat("b", 2, "", false);
  bad_beat.set_threads(-1);
  EXPECT_EQ(registry.Heartbeat(bad_beat, t0, &answer).code(), absl::StatusCode::kInvalidArgument);
}

// The same-host list follows a worker that moves host, stops or is forgotten (the registry keeps
// an index by host, so that these answers do not walk the whole table).
TEST(WorkerRegistryTest, SameHostWorkers_FollowMovesStopsAndForgetting) {
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  WorkerRegistry registry(absl::Seconds(10));
  auto auto_worker = [](const std::string& name, uint64_t incarnation, const std::string& host) {
    v1::WorkerInfo w = Worker(name, incarnation);
    w.set_host(host);
    w.set_allowed_cpus("0-3");
    w.set_cpus_auto(true);
    return w;
  };
  ASSERT_TRUE(registry.Register(auto_worker("a", 1, "h1"), t0).ok());
  ASSERT_TRUE(registry.Register(auto_worker("b", 2, "h1"), t0).ok());
  ASSERT_TRUE(registry.Register(auto_worker("c", 3, "h1"), t0).ok());
  auto peers_of = [&](const std::string& name, uint64_t incarnation, absl::Time at) {
    v1::WorkerHeartbeatResponse answer;
    EXPECT_TRUE(registry.Heartbeat(Beat(name, incarnation, "", false), at, &answer).ok());
    std::vector<std::string> names;
    for (const v1::WorkerInfo& w : answer.same_host()) names.push_back(w.name());
    return names;
  };
  EXPECT_THAT(peers_of("a", 1, t0), ElementsAre("b", "c"));
  // b comes back as a new process on another host: no longer a's neighbour, c's instead.
  ASSERT_TRUE(registry.Register(auto_worker("b", 22, "h2"), t0).ok());
  ASSERT_TRUE(registry.Register(auto_worker("d", 4, "h2"), t0).ok());
  EXPECT_THAT(peers_of("a", 1, t0), ElementsAre("c"));
  EXPECT_THAT(peers_of("d", 4, t0), ElementsAre("b"));
  // c stops.
  v1::UnregisterWorkerRequest stop;
  stop.set_name("c");
  stop.set_incarnation(3);
  ASSERT_TRUE(registry.Unregister(stop).ok());
  EXPECT_THAT(peers_of("a", 1, t0), IsEmpty());
  // b falls silent long enough to be forgotten; d's list empties, and a new b on h2 is listed.
  const absl::Time later = t0 + absl::Seconds(150);
  peers_of("d", 4, later);  // d stays
  registry.Tick(later);
  EXPECT_THAT(peers_of("d", 4, later), IsEmpty());
  ASSERT_TRUE(registry.Register(auto_worker("b", 23, "h2"), later).ok());
  EXPECT_THAT(peers_of("d", 4, later), ElementsAre("b"));
}

// Past interval x rate workers, the interval handed out grows in proportion and the lost timeout
// with it: a cluster's heartbeats stay within the coordinator's budget. Heartbeat answers carry
// the current values, so daemons registered early adapt too.
TEST(WorkerRegistryTest, HeartbeatInterval_GrowsWithTheCluster_PastTheRateCap) {
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  WorkerRegistry registry(absl::Seconds(10), absl::Seconds(1), /*max_heartbeats_per_second=*/4);
  for (int i = 0; i < 4; ++i)
    ASSERT_TRUE(registry.Register(Worker(absl::StrCat("w", i), 1), t0).ok());
  EXPECT_EQ(registry.heartbeat_interval(), absl::Seconds(1)) << "4 workers x 1/s: within the cap";
  EXPECT_EQ(registry.heartbeat_timeout(), absl::Seconds(10));
  for (int i = 4; i < 12; ++i) {
    ASSERT_TRUE(registry.Register(Worker(absl::StrCat("w", i), 1), t0).ok());
  }
  EXPECT_EQ(registry.heartbeat_interval(), absl::Seconds(3)) << "12 workers at 4/s";
  EXPECT_EQ(registry.heartbeat_timeout(), absl::Seconds(30));
  v1::WorkerHeartbeatResponse answer;
  ASSERT_TRUE(registry.Heartbeat(Beat("w0", 1, "", false), t0, &answer).ok());
  EXPECT_EQ(answer.heartbeat_interval_ms(), 3000);
  EXPECT_EQ(answer.heartbeat_timeout_ms(), 30000);
  // Silent for 20 s: lost under the base timeout, alive under the scaled one; lost after 30 s.
  registry.Tick(t0 + absl::Seconds(20));
  EXPECT_EQ(StateOf(registry, "w1", t0 + absl::Seconds(20)), v1::WorkerInfo::ALIVE);
  registry.Tick(t0 + absl::Seconds(31));
  EXPECT_EQ(StateOf(registry, "w1", t0 + absl::Seconds(31)), v1::WorkerInfo::LOST);
  // No cap: the configured values whatever the size.
  WorkerRegistry uncapped(absl::Seconds(10), absl::Seconds(1));
  for (int i = 0; i < 50; ++i) {
    ASSERT_TRUE(uncapped.Register(Worker(absl::StrCat("w", i), 1), t0).ok());
  }
  EXPECT_EQ(uncapped.heartbeat_interval(), absl::Seconds(1));
  EXPECT_EQ(uncapped.heartbeat_timeout(), absl::Seconds(10));
}

// Tick names the LOST workers still placed on a job, with the job and the silence, on every tick
// while it lasts (a run told once could miss it), and stops once the job lets the worker go.
TEST(WorkerRegistryTest, Tick_ReturnsLostPlacedWorkers_WithTheirJob_UntilReleased) {
  WorkerRegistry registry(absl::Seconds(5));
  const absl::Time t0 = absl::UnixEpoch() + absl::Hours(1);
  for (const char* name : {"a", "b", "c"}) ASSERT_TRUE(registry.Register(Worker(name, 1), t0).ok());
  ASSERT_EQ(registry.Reserve("job-1", 2, 2, {}, t0).size(), 2u);  // a and b
  v1::WorkerHeartbeatResponse response;
  ASSERT_TRUE(
      registry.Heartbeat(Beat("a", 1, "job-1", false), t0 + absl::Seconds(3), &response).ok());
  EXPECT_THAT(registry.Tick(t0 + absl::Seconds(4)), IsEmpty()) << "nobody silent past 5 s yet";
  // b (placed) and c (idle) are silent past the timeout; only b is a job's concern.
  for (const absl::Duration later : {absl::Seconds(6), absl::Seconds(7)}) {
    const std::vector<WorkerRegistry::LostWorker> lost = registry.Tick(t0 + later);
    ASSERT_EQ(lost.size(), 1u);
    EXPECT_EQ(lost[0].name, "b");
    EXPECT_EQ(lost[0].job_id, "job-1");
    EXPECT_EQ(lost[0].why,
              absl::StrCat("no heartbeat for ", absl::FormatDuration(later), " (timeout 5s)"));
  }
  EXPECT_EQ(StateOf(registry, "c", t0 + absl::Seconds(7)), v1::WorkerInfo::LOST);
  registry.Release("b");
  EXPECT_THAT(registry.Tick(t0 + absl::Seconds(8)), IsEmpty());
}

TEST(WorkerRegistryTest, Draining_StaysDrainingThroughLossAndBack_UntilANewIncarnation) {
  WorkerRegistry registry(absl::Seconds(5));
  absl::Time now = absl::UnixEpoch() + absl::Hours(1);
  ASSERT_TRUE(registry.Register(Worker("a", 1), now).ok());
  ASSERT_TRUE(registry.Register(Worker("b", 2), now).ok());
  ASSERT_EQ(registry.Reserve("job-1", 1, 1, {"b"}, now).size(), 1u);
  v1::WorkerHeartbeatResponse response;
  ASSERT_TRUE(registry.Heartbeat(Beat("a", 1, "job-1", true), now, &response).ok());
  EXPECT_TRUE(response.release_pending());  // the coordinator runs job-1 on a
  EXPECT_EQ(StateOf(registry, "a", now), v1::WorkerInfo::DRAINING);
  EXPECT_THAT(registry.Draining({"b", "a"}), ElementsAre("a"));

  // Later heartbeats need not repeat it; silence makes it LOST, a heartbeat DRAINING again.
  response.Clear();
  ASSERT_TRUE(registry.Heartbeat(Beat("a", 1, "job-1", false), now, &response).ok());
  EXPECT_EQ(StateOf(registry, "a", now), v1::WorkerInfo::DRAINING);
  now += absl::Seconds(6);
  registry.Tick(now);
  EXPECT_EQ(StateOf(registry, "a", now), v1::WorkerInfo::LOST);
  ASSERT_TRUE(registry.Heartbeat(Beat("a", 1, "job-1", false), now, &response).ok());
  EXPECT_EQ(StateOf(registry, "a", now), v1::WorkerInfo::DRAINING);

  // A job the coordinator did not place there is not its to checkpoint.
  response.Clear();
  ASSERT_TRUE(registry.Heartbeat(Beat("a", 1, "someone-elses", true), now, &response).ok());
  EXPECT_FALSE(response.release_pending());

  // A restarted worker (new incarnation) is ALIVE again.
  ASSERT_TRUE(registry.Register(Worker("a", 3), now).ok());
  EXPECT_EQ(StateOf(registry, "a", now), v1::WorkerInfo::ALIVE);
  EXPECT_THAT(registry.Draining({"a", "b"}), IsEmpty());
}

v1::WorkerInfo Listed(const WorkerRegistry& registry, const std::string& name, absl::Time now) {
  for (const v1::WorkerInfo& w : registry.List(now)) {
    if (w.name() == name) return w;
  }
  return v1::WorkerInfo();
}

// A job shorter than a heartbeat interval is never reported by the worker: the assignment is
// what says the worker is not free until the job has let it go.
TEST(WorkerRegistryTest, AssignedJob_ListedFromPlacementUntilLetGo) {
  WorkerRegistry registry(absl::Seconds(5));
  const absl::Time now = absl::UnixEpoch() + absl::Hours(1);
  ASSERT_TRUE(registry.Register(Worker("a", 1), now).ok());
  ASSERT_TRUE(registry.Register(Worker("b", 2), now).ok());
  ASSERT_EQ(registry.Reserve("job-1", 1, 1, {}, now).size(), 1u);  // "a": name order
  EXPECT_EQ(Listed(registry, "a", now).assigned_job_id(), "job-1");
  EXPECT_EQ(Listed(registry, "a", now).job_id(), "");  // no heartbeat since
  EXPECT_EQ(Listed(registry, "b", now).assigned_job_id(), "");
  v1::WorkerHeartbeatResponse response;
  ASSERT_TRUE(registry.Heartbeat(Beat("a", 1, "", false), now, &response).ok());
  EXPECT_EQ(Listed(registry, "a", now).assigned_job_id(), "job-1");
  registry.Release("a");
  EXPECT_EQ(Listed(registry, "a", now).assigned_job_id(), "");
  EXPECT_EQ(Listed(registry, "a", now).name(), "a");
}

std::vector<std::string> Names(const std::vector<v1::WorkerInfo>& workers) {
  std::vector<std::string> names;
  for (const v1::WorkerInfo& w : workers) names.push_back(w.name());
  return names;
}

// A worker that tore its job down is free at once (a job's SUCCEEDED is published after that):
// Release alone (a lost worker, maybe still running the job) waits for a heartbeat without the
// job. A heartbeat that still reports the torn-down job was sent before the teardown: it is told
// to drop the job, and the worker stays free.
TEST(WorkerRegistryTest, ReleaseTornDown_FreeAtOnce_ReleaseWaitsForAHeartbeat) {
  WorkerRegistry registry(absl::Seconds(5));
  const absl::Time now = absl::UnixEpoch() + absl::Hours(1);
  ASSERT_TRUE(registry.Register(Worker("a", 1), now).ok());
  ASSERT_TRUE(registry.Register(Worker("b", 2), now).ok());
  ASSERT_EQ(registry.Reserve("job-1", 2, 2, {}, now).size(), 2u);
  v1::WorkerHeartbeatResponse response;
  ASSERT_TRUE(registry.Heartbeat(Beat("a", 1, "job-1", false), now, &response).ok());
  ASSERT_TRUE(registry.Heartbeat(Beat("b", 2, "job-1", false), now, &response).ok());

  registry.Release("a");
  registry.ReleaseTornDown("b");
  EXPECT_EQ(Listed(registry, "a", now).job_id(), "job-1");
  EXPECT_EQ(Listed(registry, "b", now).job_id(), "");
  std::vector<v1::WorkerInfo> next = registry.Reserve("job-2", 1, 2, {}, now);
  ASSERT_EQ(next.size(), 1u);
  EXPECT_EQ(next[0].name(), "b");
  registry.Release("b");

  v1::WorkerHeartbeatResponse stale;
  ASSERT_TRUE(registry.Heartbeat(Beat("b", 2, "job-1", false), now, &stale).ok());
  EXPECT_EQ(stale.abandoned_job(), "job-1");
  EXPECT_EQ(Listed(registry, "b", now).job_id(), "");
  v1::WorkerHeartbeatResponse lost_one;
  ASSERT_TRUE(registry.Heartbeat(Beat("a", 1, "job-1", false), now, &lost_one).ok());
  EXPECT_EQ(lost_one.abandoned_job(), "job-1");
  EXPECT_THAT(Names(registry.Reserve("job-3", 0, 2, {}, now)), ElementsAre("b"));
  registry.Release("b");
  ASSERT_TRUE(registry.Heartbeat(Beat("a", 1, "", false), now, &response).ok());
  EXPECT_EQ(registry.Reserve("job-3", 2, 2, {}, now).size(), 2u);
}

// A requeued job keeps its id and may be placed on a worker that tore it down before: from that
// placement the worker's heartbeats of the job count again, so a Release (the worker lost this
// time) waits for a heartbeat without the job, as for any lost worker.
TEST(WorkerRegistryTest, ReleaseTornDown_ThenPlacedAgainOnTheSameJob_ItsHeartbeatsCountAgain) {
  WorkerRegistry registry(absl::Seconds(5));
  const absl::Time now = absl::UnixEpoch() + absl::Hours(1);
  ASSERT_TRUE(registry.Register(Worker("b", 2), now).ok());
  ASSERT_EQ(registry.Reserve("job-1", 1, 1, {}, now).size(), 1u);
  v1::WorkerHeartbeatResponse response;
  ASSERT_TRUE(registry.Heartbeat(Beat("b", 2, "job-1", false), now, &response).ok());
  registry.ReleaseTornDown("b");

  ASSERT_EQ(registry.Reserve("job-1", 1, 1, {}, now).size(), 1u);  // requeued, placed again
  ASSERT_TRUE(registry.Heartbeat(Beat("b", 2, "job-1", false), now, &response).ok());
  EXPECT_EQ(Listed(registry, "b", now).job_id(), "job-1");
  registry.Release("b");
  EXPECT_THAT(registry.Reserve("job-2", 0, 1, {}, now), IsEmpty());
  ASSERT_TRUE(registry.Heartbeat(Beat("b", 2, "", false), now, &response).ok());
  EXPECT_EQ(registry.Reserve("job-2", 1, 1, {}, now).size(), 1u);
}

// The registry alone says who is free: a reserved worker, one running a job by its heartbeat,
// a draining, lost or unreachable one, and an excluded one are never reserved again.
TEST(WorkerRegistryTest, Reserve_OnlyFreeWorkers_AllOrNothingBelowMin) {
  WorkerRegistry registry(absl::Seconds(5));
  absl::Time now = absl::UnixEpoch() + absl::Hours(1);
  for (const char* name : {"a", "b", "c", "d", "e", "f"}) {
    ASSERT_TRUE(registry.Register(Worker(name, 7), now).ok());
  }
  v1::WorkerHeartbeatResponse response;
  ASSERT_TRUE(registry.Heartbeat(Beat("b", 7, "direct-job", false), now, &response).ok());
  ASSERT_TRUE(registry.Heartbeat(Beat("c", 7, "", true), now, &response).ok());
  registry.MarkUnreachable("d");

  EXPECT_THAT(Names(registry.Reserve("j1", 1, 1, {}, now)), ElementsAre("a"));
  // Free now: e and f. Three wanted at least: nothing is reserved.
  EXPECT_THAT(registry.Reserve("j2", 3, 3, {}, now), IsEmpty());
  EXPECT_EQ(Listed(registry, "e", now).assigned_job_id(), "");
  // Up to three, excluding e: only f.
  EXPECT_THAT(Names(registry.Reserve("j2", 0, 3, {"e"}, now)), ElementsAre("f"));
  EXPECT_EQ(Listed(registry, "f", now).assigned_job_id(), "j2");

  // Released, a worker is free again; its old job is one to drop if it still reports it.
  registry.Release("a");
  EXPECT_THAT(Names(registry.Reserve("j3", 2, 2, {}, now)), ElementsAre("a", "e"));
  ASSERT_TRUE(registry.Heartbeat(Beat("f", 7, "j1", false), now, &response).ok());
  EXPECT_EQ(response.abandoned_job(), "j1");
  // A lost worker is not free until it heartbeats.
  now += absl::Seconds(6);
  registry.Tick(now);
  EXPECT_THAT(registry.Reserve("j4", 1, 1, {}, now), IsEmpty());
}

// A worker that stops so quickly that its job never saw it drain (it unregistered while placed)
// counts as draining for that job until the job lets it go.
TEST(WorkerRegistryTest, UnregisteredWhilePlaced_CountsAsDrainingUntilReleased) {
  WorkerRegistry registry(absl::Seconds(5));
  const absl::Time now = absl::UnixEpoch() + absl::Hours(1);
  ASSERT_TRUE(registry.Register(Worker("a", 1), now).ok());
  ASSERT_TRUE(registry.Register(Worker("b", 2), now).ok());
  ASSERT_EQ(registry.Reserve("job-1", 1, 1, {"b"}, now).size(), 1u);
  v1::UnregisterWorkerRequest stop;
  stop.set_name("a");
  stop.set_incarnation(1);
  ASSERT_TRUE(registry.Unregister(stop).ok());
  stop.set_name("b");
  stop.set_incarnation(2);
  ASSERT_TRUE(registry.Unregister(stop).ok());  // b ran nothing: not a drain of anyone's
  EXPECT_THAT(registry.Draining({"a", "b"}), ElementsAre("a"));
  registry.Release("a");
  EXPECT_THAT(registry.Draining({"a", "b"}), IsEmpty());
}

}  // namespace worker_registry_test
}  // namespace dtrain
