// The job manager's queue and its re-form decisions, with an in-process stand-in for the
// trainer (JobRun) whose outcome each test scripts: FIFO placement where the head waits for its
// workers, re-forming an elastic job on survivors plus an idle worker, re-queueing a drained job
// until workers are back, cancelling a running job, a job's own failure, and a success published
// once its workers are released (cancel and shutdown meanwhile). No gRPC, no worker
// processes; the real trainer is tested end to end in jobs_e2e_test, elastic_job_test and
// drain_test.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/jobs/job_manager.h"
#include "coordinator/jobs/testing/fake_worker_group.h"
#include "coordinator/jobs/trainer.h"
#include "coordinator/jobs/worker_registry.h"
#include "tests/test_support.h"

namespace dtrain {
namespace job_manager_test {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::WaitFor;

// How one stand-in run ends.
struct Script {
  absl::Status status;
  std::vector<std::string> lost;     // besides the drained ones
  std::vector<std::string> drained;  // let go after a checkpoint
  bool hold = false;                 // Run waits until Release (or Cancel)
  bool hold_teardown = false;        // Teardown waits until ReleaseTeardown
  bool ignores_cancel = false;       // Run returns `status` even when cancelled
};

// One placement, as the manager made it.
struct Placement {
  std::string job_id;
  std::string group;
  std::vector<std::string> workers;
  std::string ckpt_path;
};

class FakeRuns;

class FakeRun final : public JobRun {
 public:
  FakeRun(Script script, FakeRuns* runs) : script_(std::move(script)), runs_(runs) {}
  absl::Status Run() override;
  void Teardown() override;
  void Cancel() override {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
  }
  std::vector<std::string> unreachable_workers() const override { return {}; }
  std::vector<std::string> lost_workers() const override {
    std::vector<std::string> lost = script_.lost;
    lost.insert(lost.end(), script_.drained.begin(), script_.drained.end());
    return lost;
  }
  const std::vector<std::string>& drained_workers() const override { return script_.drained; }

 private:
  const Script script_;
  FakeRuns* const runs_;
  absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  friend class FakeRuns;
};

// The runs the manager makes, in order; each takes the next script (default: succeed).
class FakeRuns {
 public:
  void Push(Script script) {
    absl::MutexLock lock(&mu_);
    scripts_.push_back(std::move(script));
  }
  // Lets held runs finish.
  void Release() {
    absl::MutexLock lock(&mu_);
    released_ = true;
  }
  // Lets held teardowns finish.
  void ReleaseTeardown() {
    absl::MutexLock lock(&mu_);
    teardown_released_ = true;
  }
  bool tearing_down() const {
    absl::MutexLock lock(&mu_);
    return tearing_down_;
  }
  std::vector<Placement> placements() const {
    absl::MutexLock lock(&mu_);
    return placements_;
  }
  JobRunFactory Factory() {
    return [this](const TrainerOptions& options, TrainerReporter*) -> std::unique_ptr<JobRun> {
      absl::MutexLock lock(&mu_);
      Placement p{options.job_id, options.group, {}, options.spec.ckpt_path()};
      for (const v1::WorkerInfo& w : options.workers) p.workers.push_back(w.name());
      placements_.push_back(std::move(p));
      Script script;
      if (!scripts_.empty()) {
        script = std::move(scripts_.front());
        scripts_.pop_front();
      }
      return std::make_unique<FakeRun>(std::move(script), this);
    };
  }
  // Blocks a held run until Release or its Cancel, at most 30 s (no wait is unbounded).
  void WaitForRelease(FakeRun& run) {
    auto done = [&] {
      absl::MutexLock lock(&run.mu_);
      return run.cancelled_;
    };
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (absl::Now() < deadline && !done()) {
      {
        absl::MutexLock lock(&mu_);
        if (released_) return;
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
  }

 private:
  mutable absl::Mutex mu_;
  std::deque<Script> scripts_ ABSL_GUARDED_BY(mu_);
  std::vector<Placement> placements_ ABSL_GUARDED_BY(mu_);
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  bool teardown_released_ ABSL_GUARDED_BY(mu_) = false;
  bool tearing_down_ ABSL_GUARDED_BY(mu_) = false;  // one held teardown at a time
  friend class FakeRun;
};

absl::Status FakeRun::Run() {
  if (script_.hold) runs_->WaitForRelease(*this);
  absl::MutexLock lock(&mu_);
  if (cancelled_ && !script_.ignores_cancel) return absl::CancelledError("the job was cancelled");
  return script_.status;
}

void FakeRun::Teardown() {
  if (!script_.hold_teardown) return;
  absl::MutexLock lock(&runs_->mu_);
  runs_->tearing_down_ = true;
  runs_->mu_.AwaitWithTimeout(absl::Condition(&runs_->teardown_released_), absl::Seconds(30));
  runs_->tearing_down_ = false;
}

v1::WorkerInfo Worker(const std::string& name) {
  v1::WorkerInfo w;
  w.set_name(name);
  w.set_address(name + ":1");
  w.set_host("h");
  w.set_devices(1);
  w.set_incarnation(7);
  return w;
}

v1::JobSpec Spec(const std::string& name, int workers, int min_nodes = 0) {
  v1::JobSpec spec;
  spec.set_name(name);
  spec.mutable_model()->set_builtin("mlp");
  spec.mutable_data()->mutable_synthetic()->set_train_size(64);
  spec.mutable_trainer()->set_num_nodes(workers);
  spec.mutable_trainer()->set_min_nodes(min_nodes);
  return spec;
}

// The real Trainer on in-process fake workers, through the manager's re-form path: an elastic job
// loses a worker mid-call after its step-6 checkpoint, re-forms on the survivor and an idle
// worker, resumes from that checkpoint, and ends with exactly the weights of a run that lost
// nothing (the fake's reduction is deterministic, as the workers' is).
class TrainerOnFakes {
 public:
  // `lose_at`: the training call of the first run during which w1 is lost (-1: never).
  explicit TrainerOnFakes(int lose_at) : lose_at_(lose_at) {}
  JobRunFactory Factory() {
    return [this](const TrainerOptions& options, TrainerReporter* reporter) {
      testing::FakeWorkerGroupOptions fake;
      fake.workers.clear();
      for (const v1::WorkerInfo& w : options.workers) fake.workers.push_back(w.name());
      fake.store = &store_;
      // The hook marks w1 lost in its own group, as the registry's monitor would.
      auto self = std::make_shared<testing::FakeWorkerGroup*>(nullptr);
      if (runs_++ == 0 && lose_at_ >= 0) {
        fake.before_call = [self, lose_at = lose_at_](const testing::FakeCall& call) {
          if (call.what == "training_step" && call.index == lose_at) {
            (*self)->MarkLost("w1", "no heartbeat for 5.0 s");
          }
          return absl::OkStatus();
        };
      }
      auto group = std::make_unique<testing::FakeWorkerGroup>(std::move(fake));
      *self = group.get();
      return std::make_unique<Trainer>(options, reporter, std::move(group));
    };
  }
  // The job's last checkpoint, written at the end of fit (the groups went with their runs).
  double weight() const { return store_.Find("last.ckpt")->weight; }
  int64_t global_step() const { return store_.Find("last.ckpt")->global_step; }
  int runs() const { return runs_; }

 private:
  const int lose_at_;
  testing::FakeCheckpointStore store_;
  int runs_ = 0;
};

class JobManagerTest : public ::testing::Test {
 protected:
  JobManagerTest()
      : registry_(absl::Seconds(5)),
        state_dir_(absl::StrCat(::testing::TempDir(), "/job-manager-", getpid(), "-",
                                ::testing::UnitTest::GetInstance()->random_seed(), "-",
                                absl::ToUnixNanos(absl::Now()))) {
    manager_ = MakeManager();
  }
  std::unique_ptr<JobManager> MakeManager(JobRunFactory make_run = nullptr) {
    JobManagerOptions options;
    options.state_dir = state_dir_;
    options.make_run = make_run ? std::move(make_run) : runs_.Factory();
    return std::make_unique<JobManager>(options, &registry_);
  }
  ~JobManagerTest() override {
    runs_.Release();
    runs_.ReleaseTeardown();
    manager_->Shutdown();
  }

  void AddWorkers(const std::vector<std::string>& names) {
    for (const std::string& name : names) {
      ASSERT_TRUE(registry_.Register(Worker(name), absl::Now()).ok());
    }
  }
  std::string Submit(const v1::JobSpec& spec) {
    absl::StatusOr<v1::JobStatus> status = manager_->Submit(spec, /*validate_only=*/false);
    EXPECT_TRUE(status.ok()) << status.status();
    return status.ok() ? status->id() : "";
  }
  v1::JobStatus Get(const std::string& id) { return *manager_->Get(id, false); }
  // A 2-worker job whose run succeeded and whose teardown is held (ReleaseTeardown): it is
  // succeeding, not yet published. Its id, or "" when the teardown was not reached in 30 s.
  std::string SucceedingWithTeardownHeld() {
    AddWorkers({"w0", "w1"});
    Script script;
    script.hold_teardown = true;
    runs_.Push(script);
    const std::string id = Submit(Spec("ending", 2));
    const bool held = WaitFor(
        [&] {
          manager_->Schedule();
          return runs_.tearing_down();
        },
        absl::Seconds(30));
    return held ? id : "";
  }
  // Schedules (as the coordinator's monitor does each tick) until `state`, at most 30 s.
  bool WaitForState(const std::string& id, v1::JobState state) {
    return WaitFor(
        [&] {
          manager_->Schedule();
          return Get(id).state() == state;
        },
        absl::Seconds(30));
  }
  std::string Log(const std::string& id) {
    int64_t next = 0;
    return absl::StrJoin(*manager_->Logs(id, 0, &next), "\n");
  }
  std::string AssignedTo(const std::string& worker) {
    for (const v1::WorkerInfo& w : registry_.List(absl::Now())) {
      if (w.name() == worker) return w.assigned_job_id();
    }
    return "(no such worker)";
  }

  WorkerRegistry registry_;
  const std::string state_dir_;
  FakeRuns runs_;
  std::unique_ptr<JobManager> manager_;
};

TEST_F(JobManagerTest, Fifo_TheHeadWaitsForItsWorkers_AndLaterJobsWaitBehindIt) {
  AddWorkers({"w0", "w1", "w2"});
  runs_.Push({absl::OkStatus(), {}, {}, /*hold=*/true});
  const std::string a = Submit(Spec("a", 2));
  ASSERT_TRUE(WaitForState(a, v1::RUNNING));
  const std::string b = Submit(Spec("b", 2));  // one worker free: b waits
  const std::string c = Submit(Spec("c", 1));  // fits, but waits behind b
  manager_->Schedule();
  EXPECT_EQ(Get(b).state(), v1::QUEUED);
  EXPECT_EQ(Get(c).state(), v1::QUEUED);
  EXPECT_EQ(AssignedTo("w2"), "");

  runs_.Release();
  ASSERT_TRUE(WaitForState(a, v1::SUCCEEDED));
  ASSERT_TRUE(WaitForState(b, v1::SUCCEEDED));
  ASSERT_TRUE(WaitForState(c, v1::SUCCEEDED));
  // b and c are placed in one pass, each on its own thread: look them up by job.
  std::map<std::string, std::vector<std::string>> workers_of;
  for (const Placement& p : runs_.placements()) workers_of[p.job_id] = p.workers;
  ASSERT_EQ(workers_of.size(), 3u);
  EXPECT_THAT(workers_of[a], ElementsAre("w0", "w1"));
  EXPECT_EQ(workers_of[b].size(), 2u);
  EXPECT_EQ(workers_of[c].size(), 1u);
  ASSERT_TRUE(WaitFor([&] { return AssignedTo("w0").empty() && AssignedTo("w2").empty(); },
                      absl::Seconds(10)));
}

TEST_F(JobManagerTest, LostWorker_ElasticJob_ReformsOnTheSurvivorAndAnIdleWorker) {
  AddWorkers({"w0", "w1", "w2"});
  runs_.Push({absl::UnavailableError("training_step lost worker 'w1'"), {"w1"}, {}});
  const std::string id = Submit(Spec("elastic", 2, /*min_nodes=*/1));
  ASSERT_TRUE(WaitForState(id, v1::SUCCEEDED));
  const std::vector<Placement> placed = runs_.placements();
  ASSERT_EQ(placed.size(), 2u);
  EXPECT_THAT(placed[0].workers, ElementsAre("w0", "w1"));
  EXPECT_THAT(placed[1].workers, ElementsAre("w0", "w2")) << "never the lost worker";
  EXPECT_EQ(placed[1].group, id + ".1") << "each run has a group of its own";
  EXPECT_THAT(Log(id), HasSubstr("lost worker(s) 'w1'"));
  EXPECT_THAT(Log(id), HasSubstr("(restart 1 of 3)"));
  EXPECT_THAT(Get(id).workers(), ElementsAre("w0", "w2"));
}

TEST_F(JobManagerTest, Drained_TooFewWorkersLeft_RequeuedThenResumesWhenOneJoins) {
  AddWorkers({"w0", "w1"});
  runs_.Push({absl::UnavailableError("worker(s) 'w1' stopped (drained)"),
              {},
              {"w1"},
              /*hold=*/true});
  v1::JobSpec spec = Spec("drained", 2);  // not elastic: needs both
  spec.set_ckpt_path("/data/user.ckpt");
  const std::string id = Submit(spec);
  ASSERT_TRUE(WaitForState(id, v1::RUNNING));
  // w1 says it is stopping (its heartbeat), then the run lets it go.
  v1::WorkerHeartbeatRequest beat;
  beat.set_name("w1");
  beat.set_incarnation(7);
  beat.set_job_id(id);
  beat.set_draining(true);
  v1::WorkerHeartbeatResponse response;
  ASSERT_TRUE(registry_.Heartbeat(beat, absl::Now(), &response).ok());
  EXPECT_TRUE(response.release_pending());
  runs_.Release();
  ASSERT_TRUE(WaitFor(
      [&] {
        manager_->Schedule();
        const v1::JobStatus s = Get(id);
        return s.state() == v1::QUEUED && s.progress().phase() == "waiting to resume";
      },
      absl::Seconds(30)));
  // No checkpoint was written: it resumes from where it started, the user's checkpoint.
  EXPECT_THAT(Log(id), HasSubstr("1 worker(s) left of the 2 needed: the job waits in the queue "
                                 "and resumes from /data/user.ckpt"));
  manager_->Schedule();
  EXPECT_EQ(runs_.placements().size(), 1u) << "one free worker is not enough";

  AddWorkers({"w2"});
  ASSERT_TRUE(WaitForState(id, v1::SUCCEEDED));
  const std::vector<Placement> placed = runs_.placements();
  ASSERT_EQ(placed.size(), 2u);
  EXPECT_THAT(placed[1].workers, ElementsAre("w0", "w2"));
  EXPECT_EQ(placed[1].ckpt_path, "/data/user.ckpt");
}

TEST_F(JobManagerTest, Cancel_RunningJob_CancelledAndItsWorkersFreed) {
  AddWorkers({"w0", "w1"});
  runs_.Push({absl::OkStatus(), {}, {}, /*hold=*/true});
  const std::string id = Submit(Spec("long", 2));
  ASSERT_TRUE(WaitForState(id, v1::RUNNING));
  EXPECT_EQ(AssignedTo("w0"), id);
  ASSERT_TRUE(manager_->Cancel(id).ok());
  ASSERT_TRUE(WaitForState(id, v1::CANCELLED));
  EXPECT_EQ(Get(id).reason(), "cancelled by request");
  EXPECT_EQ(manager_->Cancel(id).status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(WaitFor([&] { return AssignedTo("w0").empty() && AssignedTo("w1").empty(); },
                      absl::Seconds(10)));
}

// Every call that names a job refuses an empty or overlong id as the caller's mistake, and an
// unknown one as not found; an overlong id is not echoed (a message travels in a header).
TEST_F(JobManagerTest, EveryCallNamingAJob_EmptyOrOverlongIdRefused_UnknownNotFound) {
  const std::string overlong(300, 'x');
  int64_t next_line = 0;
  const std::vector<std::pair<std::string, std::function<absl::Status(const std::string&)>>> calls =
      {
          {"Get", [&](const std::string& id) { return manager_->Get(id, false).status(); }},
          {"Cancel", [&](const std::string& id) { return manager_->Cancel(id).status(); }},
          {"Delete", [&](const std::string& id) { return manager_->Delete(id).status(); }},
          {"Logs",
           [&](const std::string& id) { return manager_->Logs(id, 0, &next_line).status(); }},
          {"Metrics", [&](const std::string& id) { return manager_->Metrics(id).status(); }},
      };
  for (const auto& [name, call] : calls) {
    const absl::Status empty = call("");
    EXPECT_EQ(empty.code(), absl::StatusCode::kInvalidArgument) << name << ": " << empty;
    EXPECT_THAT(empty.message(), HasSubstr("id is empty: name a job")) << name;
    const absl::Status long_id = call(overlong);
    EXPECT_EQ(long_id.code(), absl::StatusCode::kInvalidArgument) << name << ": " << long_id;
    EXPECT_EQ(long_id.message(), "id is 300 bytes; no job id is longer than 256 (dtrain list)")
        << name;
    const absl::Status unknown = call("nosuch-1");
    EXPECT_EQ(unknown.code(), absl::StatusCode::kNotFound) << name << ": " << unknown;
    EXPECT_THAT(unknown.message(), HasSubstr("no job 'nosuch-1'; see dtrain list")) << name;
  }
}

// A success is published once its workers are released: during its teardown the job reads
// RUNNING and a cancel is refused as for an ended job; once SUCCEEDED is seen, its workers,
// whose heartbeats reported the job, are reserved at once, with no heartbeat since.
TEST_F(JobManagerTest, Success_PublishedOnceItsWorkersAreFree_CancelRefusedMeanwhile) {
  AddWorkers({"w0", "w1"});
  Script script;
  script.hold_teardown = true;
  runs_.Push(script);
  const std::string id = Submit(Spec("quick", 2));
  ASSERT_TRUE(WaitForState(id, v1::RUNNING));
  for (const char* name : {"w0", "w1"}) {
    v1::WorkerHeartbeatRequest beat;
    beat.set_name(name);
    beat.set_incarnation(7);
    beat.set_job_id(id);
    v1::WorkerHeartbeatResponse response;
    ASSERT_TRUE(registry_.Heartbeat(beat, absl::Now(), &response).ok());
  }
  ASSERT_TRUE(WaitFor([&] { return runs_.tearing_down(); }, absl::Seconds(10)));
  EXPECT_EQ(Get(id).state(), v1::RUNNING);
  EXPECT_EQ(AssignedTo("w0"), id);
  absl::StatusOr<v1::JobStatus> cancel = manager_->Cancel(id);
  EXPECT_EQ(cancel.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(cancel.status().message()), HasSubstr("already ended (SUCCEEDED"));

  runs_.ReleaseTeardown();
  ASSERT_TRUE(WaitFor([&] { return Get(id).state() == v1::SUCCEEDED; }, absl::Seconds(10)));
  EXPECT_EQ(registry_.Reserve("next", 2, 2, {}, absl::Now()).size(), 2u);
}

// A coordinator that stops while a success is releasing its workers stores SUCCEEDED: the next
// one on the same database does not run the job again.
TEST_F(JobManagerTest, Shutdown_WhileASuccessReleasesItsWorkers_TheDatabaseKeepsItSucceeded) {
  const std::string database = state_dir_ + "/coordinator.db";
  ASSERT_TRUE(manager_->Restore(database).ok());
  const std::string id = SucceedingWithTeardownHeld();
  ASSERT_FALSE(id.empty());
  // The teardown is held until the shutdown has begun (it then refuses new jobs), so the shutdown
  // meets the job succeeding, not yet published.
  std::thread shutdown([&] { manager_->Shutdown(); });
  EXPECT_TRUE(WaitFor(
      [&] {
        return manager_->Submit(Spec("late", 1), false).status().code() ==
               absl::StatusCode::kUnavailable;
      },
      absl::Seconds(10)));
  EXPECT_EQ(Get(id).state(), v1::RUNNING);
  absl::SleepFor(absl::Milliseconds(100));  // past Shutdown's loop over the jobs
  runs_.ReleaseTeardown();
  shutdown.join();
  const v1::JobStatus published = Get(id);
  EXPECT_EQ(published.state(), v1::SUCCEEDED);
  manager_.reset();

  manager_ = MakeManager();
  ASSERT_TRUE(manager_->Restore(database).ok());
  EXPECT_EQ(Get(id).state(), v1::SUCCEEDED);  // not RUNNING: it is not queued to run again
  // The job's thread stored the publish itself (the shutdown left it the store), not only the
  // view MarkSucceeding stored before the teardown: its time is the publish's.
  EXPECT_EQ(Get(id).finished_unix_ms(), published.finished_unix_ms());
}

// A coordinator SIGKILLed while a success releases its workers: the database, as the kill
// leaves it (its files copied while the teardown is held), already has the job SUCCEEDED, so
// a restart does not run it again; and the workers, never told to tear it down, are told to
// drop it when they heartbeat to the restarted coordinator.
TEST_F(JobManagerTest, KilledWhileASuccessReleasesItsWorkers_TheDatabaseHasItSucceeded) {
  const std::string database = state_dir_ + "/coordinator.db";
  ASSERT_TRUE(manager_->Restore(database).ok());
  const std::string id = SucceedingWithTeardownHeld();
  ASSERT_FALSE(id.empty());
  EXPECT_EQ(Get(id).state(), v1::RUNNING);  // published once the workers are free
  const std::string killed = state_dir_ + "/as-killed";
  std::filesystem::create_directories(killed);
  for (const char* suffix : {"", "-wal"}) {
    if (std::filesystem::exists(database + suffix)) {
      std::filesystem::copy_file(database + suffix, killed + "/coordinator.db" + suffix);
    }
  }
  runs_.ReleaseTeardown();
  ASSERT_TRUE(WaitForState(id, v1::SUCCEEDED));

  // The restarted coordinator: its own registry, which the workers join again.
  WorkerRegistry registry(absl::Seconds(5));
  ASSERT_TRUE(registry.Register(Worker("w0"), absl::Now()).ok());
  JobManagerOptions options;
  options.state_dir = killed;
  options.make_run = runs_.Factory();
  JobManager restarted(options, &registry);
  ASSERT_TRUE(restarted.Restore(killed + "/coordinator.db").ok());
  absl::StatusOr<v1::JobStatus> status = restarted.Get(id, false);
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->state(), v1::SUCCEEDED);
  EXPECT_EQ(status->progress().phase(), "done");
  EXPECT_GT(status->finished_unix_ms(), 0);
  v1::WorkerHeartbeatRequest beat;
  beat.set_name("w0");
  beat.set_incarnation(7);
  beat.set_job_id(id);
  v1::WorkerHeartbeatResponse response;
  ASSERT_TRUE(registry.Heartbeat(beat, absl::Now(), &response).ok());
  EXPECT_EQ(response.abandoned_job(), id);
  restarted.Shutdown();
}

// A delete of a job whose success is releasing its workers waits for the release (the job's
// thread still uses its record and files), then removes it.
TEST_F(JobManagerTest, DeleteWhileASuccessReleasesItsWorkers_WaitsThenRemovesIt) {
  const std::string id = SucceedingWithTeardownHeld();
  ASSERT_FALSE(id.empty());
  std::atomic<bool> returned{false};
  absl::StatusOr<v1::DeleteJobResponse> deleted;
  std::thread deleter([&] {
    deleted = manager_->Delete(id);
    returned = true;
  });
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_FALSE(returned.load());  // still releasing
  EXPECT_TRUE(manager_->Get(id, false).ok());
  runs_.ReleaseTeardown();
  deleter.join();
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_EQ(deleted->id(), id);
  EXPECT_EQ(manager_->Get(id, false).status().code(), absl::StatusCode::kNotFound);
}

// A run that succeeds just as the coordinator shuts down (the shutdown's interrupt came first,
// the run had finished its work): a success is never resumed, so the database has it
// SUCCEEDED for the next coordinator.
TEST_F(JobManagerTest, SuccessLandingAfterTheShutdownsInterrupt_StoredSucceeded) {
  const std::string database = state_dir_ + "/coordinator.db";
  ASSERT_TRUE(manager_->Restore(database).ok());
  AddWorkers({"w0", "w1"});
  Script script;
  script.hold = true;
  script.ignores_cancel = true;
  runs_.Push(script);
  const std::string id = Submit(Spec("late-success", 2));
  ASSERT_TRUE(WaitForState(id, v1::RUNNING));
  manager_->Shutdown();  // interrupts the held run, which returns its success all the same
  EXPECT_EQ(Get(id).state(), v1::SUCCEEDED);
  manager_.reset();

  manager_ = MakeManager();
  ASSERT_TRUE(manager_->Restore(database).ok());
  EXPECT_EQ(Get(id).state(), v1::SUCCEEDED);  // not RUNNING, to be run again
}

TEST_F(JobManagerTest, JobsOwnFailure_FailedWithItsMessage_NoRestart) {
  AddWorkers({"w0", "w1", "w2"});
  runs_.Push({absl::InvalidArgumentError("model: training_step returned a string"), {}, {}});
  const std::string id = Submit(Spec("broken", 2, /*min_nodes=*/1));
  ASSERT_TRUE(WaitForState(id, v1::FAILED));
  EXPECT_EQ(Get(id).reason(), "model: training_step returned a string");
  EXPECT_EQ(runs_.placements().size(), 1u);
}

// A coordinator that stops while a job runs, before the job's first checkpoint: the next one on
// the same database starts it again from where the user asked it to start, not from scratch.
TEST_F(JobManagerTest, Restore_RunningBeforeFirstCheckpoint_StartsAgainFromTheSpecsCkptPath) {
  const std::string database = state_dir_ + "/coordinator.db";
  ASSERT_TRUE(manager_->Restore(database).ok());
  AddWorkers({"w0", "w1"});
  runs_.Push({absl::OkStatus(), {}, {}, /*hold=*/true});
  v1::JobSpec spec = Spec("interrupted", 2);
  spec.set_ckpt_path("/data/user.ckpt");
  const std::string id = Submit(spec);
  ASSERT_TRUE(WaitForState(id, v1::RUNNING));
  manager_->Shutdown();  // cancels the held run; the database keeps the job RUNNING
  manager_.reset();      // lets go of the database's lock

  manager_ = MakeManager();
  ASSERT_TRUE(manager_->Restore(database).ok());
  EXPECT_THAT(Log(id), HasSubstr("before its first checkpoint; it starts again from "
                                 "/data/user.ckpt once its workers are back"));
  ASSERT_TRUE(WaitFor([&] { return AssignedTo("w0").empty() && AssignedTo("w1").empty(); },
                      absl::Seconds(10)));
  ASSERT_TRUE(WaitForState(id, v1::SUCCEEDED));
  const std::vector<Placement> placed = runs_.placements();
  ASSERT_EQ(placed.size(), 2u);
  EXPECT_EQ(placed[1].job_id, id);
  EXPECT_EQ(placed[1].ckpt_path, "/data/user.ckpt");
}

TEST_F(JobManagerTest, LostWorkerMidCall_RealTrainerReforms_FinalWeightsEqualAnUninterruptedRun) {
  v1::JobSpec spec = Spec("elastic", 2, /*min_nodes=*/1);
  spec.mutable_data()->set_batch_size(8);
  spec.mutable_trainer()->set_max_epochs(3);
  spec.mutable_trainer()->set_batches_per_call(1);
  spec.mutable_checkpoint()->set_every_n_steps(3);
  spec.mutable_data()->mutable_synthetic()->set_val_size(16);
  spec.mutable_data()->mutable_synthetic()->set_test_size(16);

  TrainerOnFakes whole(/*lose_at=*/-1);
  manager_->Shutdown();
  manager_ = MakeManager(whole.Factory());
  AddWorkers({"w0", "w1", "w2"});
  const std::string first = Submit(spec);
  ASSERT_TRUE(WaitForState(first, v1::SUCCEEDED)) << Log(first);
  EXPECT_EQ(whole.runs(), 1);
  EXPECT_EQ(whole.global_step(), 12);

  TrainerOnFakes interrupted(/*lose_at=*/7);
  manager_->Shutdown();
  manager_ = MakeManager(interrupted.Factory());
  const std::string id = Submit(spec);
  ASSERT_TRUE(WaitForState(id, v1::SUCCEEDED)) << Log(id);
  EXPECT_EQ(interrupted.runs(), 2);
  EXPECT_THAT(Log(id), HasSubstr("training_step lost worker 'w1' (rank 1) (no heartbeat"));
  EXPECT_THAT(Log(id), HasSubstr("resumed from job:" + id +
                                 "/last.ckpt at step 6 (epoch 1, "
                                 "batch 2)"));
  EXPECT_THAT(Get(id).workers(), ElementsAre("w0", "w2"));
  EXPECT_EQ(interrupted.global_step(), 12);
  EXPECT_EQ(interrupted.weight(), whole.weight());
}

}  // namespace job_manager_test
}  // namespace dtrain
