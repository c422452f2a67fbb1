// The coordinator's job database: what goes in comes back in submission order, updates replace
// the status, metric points follow their job, a damaged row is skipped rather than fatal, and a
// second coordinator cannot open a database the first one holds.
#include <sqlite3.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "coordinator/jobs/job_store.h"

namespace dtrain::testing {
namespace job_store_test {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class JobStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "/job-store-", getpid(), "-",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    path_ = dir_ + "/coordinator.db";
  }

  static v1::JobStatus Status(const std::string& id, v1::JobState state) {
    v1::JobStatus s;
    s.set_id(id);
    s.set_state(state);
    return s;
  }

  // Edits the database behind the store's back, as a damaged or newer file would be.
  void ExecSql(const char* sql) {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
    const int rc = sqlite3_exec(db, sql, nullptr, nullptr, nullptr);
    sqlite3_close(db);
    ASSERT_EQ(rc, SQLITE_OK) << sql;
  }

  std::string dir_, path_;
};

TEST_F(JobStoreTest, RoundTripInSubmissionOrder) {
  {
    auto store = JobStore::Open(path_);
    ASSERT_TRUE(store.ok()) << store.status();
    v1::JobSpec spec;
    spec.set_name("zeta");
    spec.mutable_trainer()->set_max_epochs(7);
    ASSERT_TRUE((*store)->Insert(spec, Status("zeta-1", v1::QUEUED)).ok());
    spec.set_name("alpha");
    ASSERT_TRUE((*store)->Insert(spec, Status("alpha-1", v1::QUEUED)).ok());
    v1::JobStatus running = Status("zeta-1", v1::RUNNING);
    running.set_checkpoint("/ckpt/last.ckpt");
    (*running.mutable_metrics())["val_acc"] = 0.875;
    running.mutable_progress()->set_global_step(42);
    ASSERT_TRUE((*store)->Update(running).ok());
    v1::MetricPoint p;
    p.set_name("train_loss");
    p.set_step(3);
    p.set_epoch(1);
    p.set_value(0.25);
    p.set_wall_unix_ms(1234);
    ASSERT_TRUE((*store)->AddMetric("zeta-1", p).ok());
    p.set_step(4);
    ASSERT_TRUE((*store)->AddMetric("zeta-1", p).ok());
    // A call's points in one transaction, in their order; an empty batch writes nothing.
    std::vector<v1::MetricPoint> batch(3, p);
    for (int i = 0; i < 3; ++i) batch[i].set_step(5 + i);
    batch[2].set_name("lr-SGD");
    ASSERT_TRUE((*store)->AddMetrics("zeta-1", batch).ok());
    ASSERT_TRUE((*store)->AddMetrics("zeta-1", {}).ok());
    // A duplicate id is refused, not silently doubled.
    EXPECT_FALSE((*store)->Insert(spec, Status("alpha-1", v1::QUEUED)).ok());
  }
  auto store = JobStore::Open(path_);
  ASSERT_TRUE(store.ok()) << store.status();
  std::vector<std::string> skipped;
  auto jobs = (*store)->LoadAll(&skipped);
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  EXPECT_TRUE(skipped.empty());
  ASSERT_EQ(jobs->size(), 2u);
  const JobStore::StoredJob& zeta = (*jobs)[0];
  EXPECT_EQ(zeta.status.id(), "zeta-1");
  EXPECT_EQ(zeta.status.state(), v1::RUNNING);
  EXPECT_EQ(zeta.status.checkpoint(), "/ckpt/last.ckpt");
  EXPECT_EQ(zeta.status.metrics().at("val_acc"), 0.875);
  EXPECT_EQ(zeta.status.progress().global_step(), 42);
  EXPECT_EQ(zeta.spec.name(), "zeta");
  EXPECT_EQ(zeta.spec.trainer().max_epochs(), 7);
  auto points = (*store)->Points("zeta-1");
  ASSERT_TRUE(points.ok()) << points.status();
  ASSERT_EQ(points->size(), 5u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ((*points)[i].step(), 3 + i);
  EXPECT_EQ((*points)[4].name(), "lr-SGD");
  EXPECT_EQ((*points)[1].name(), "train_loss");
  EXPECT_EQ((*points)[1].value(), 0.25);
  EXPECT_EQ((*points)[1].wall_unix_ms(), 1234);
  EXPECT_EQ((*jobs)[1].status.id(), "alpha-1");
  EXPECT_EQ((*jobs)[1].status.state(), v1::QUEUED);
  auto none = (*store)->Points("alpha-1");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

TEST_F(JobStoreTest, SecondCoordinatorRefused_UntilTheFirstCloses) {
  auto first = JobStore::Open(path_);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = JobStore::Open(path_);
  ASSERT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(
      second.status().message(),
      HasSubstr(absl::StrCat("another coordinator (pid ", getpid(), ") uses the job database")));
  first->reset();
  EXPECT_TRUE(JobStore::Open(path_).ok());
}

TEST_F(JobStoreTest, DamagedRowSkipped_OthersLoad) {
  {
    auto store = JobStore::Open(path_);
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE((*store)->Insert(v1::JobSpec(), Status("good-1", v1::SUCCEEDED)).ok());
    ASSERT_TRUE((*store)->Insert(v1::JobSpec(), Status("bad-1", v1::RUNNING)).ok());
  }
  ASSERT_NO_FATAL_FAILURE(ExecSql("UPDATE jobs SET status = x'ffffffff' WHERE id = 'bad-1'"));
  auto store = JobStore::Open(path_);
  ASSERT_TRUE(store.ok());
  std::vector<std::string> skipped;
  auto jobs = (*store)->LoadAll(&skipped);
  ASSERT_TRUE(jobs.ok());
  ASSERT_EQ(jobs->size(), 1u);
  EXPECT_EQ((*jobs)[0].status.id(), "good-1");
  EXPECT_THAT(skipped, ElementsAre("bad-1"));
}

TEST_F(JobStoreTest, NotADatabaseOrNewerSchema_ClearError) {
  std::ofstream(path_) << "this is not an sqlite file, but long enough to look like one..........";
  auto garbage = JobStore::Open(path_);
  ASSERT_FALSE(garbage.ok());
  EXPECT_THAT(garbage.status().message(), HasSubstr(path_));
  std::filesystem::remove(path_);
  { ASSERT_TRUE(JobStore::Open(path_).ok()); }
  ASSERT_NO_FATAL_FAILURE(ExecSql("UPDATE meta SET value = '99' WHERE key = 'schema_version'"));
  auto newer = JobStore::Open(path_);
  ASSERT_EQ(newer.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(newer.status().message(),
              HasSubstr("has schema version 99; this coordinator reads 1"));
}

}  // namespace job_store_test
}  // namespace dtrain::testing
