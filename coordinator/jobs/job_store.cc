#include "coordinator/jobs/job_store.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace dtrain {
namespace {

constexpr int kSchemaVersion = 1;

constexpr char kSchema[] = R"sql(
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,  -- submission order
  id TEXT NOT NULL UNIQUE,
  state TEXT NOT NULL,                    -- for people reading the file with sqlite3
  spec BLOB NOT NULL,                     -- dtrain.v1.JobSpec
  status BLOB NOT NULL,                   -- dtrain.v1.JobStatus, without spec
  updated_unix_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS metrics (
  job_id TEXT NOT NULL,
  name TEXT NOT NULL,
  step INTEGER NOT NULL,
  epoch INTEGER NOT NULL,
  value REAL NOT NULL,
  wall_unix_ms INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS metrics_by_job ON metrics (job_id);
)sql";

// A prepared statement, finalized on scope exit.
class Statement {
 public:
  Statement(sqlite3* db, const char* sql) {
    rc_ = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr);
  }
  ~Statement() { sqlite3_finalize(stmt_); }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  bool ok() const { return rc_ == SQLITE_OK; }
  sqlite3_stmt* get() { return stmt_; }
  void Text(int i, const std::string& s) {
    sqlite3_bind_text(stmt_, i, s.data(), static_cast<int>(s.size()), SQLITE_TRANSIENT);
  }
  void Blob(int i, const std::string& s) {
    sqlite3_bind_blob(stmt_, i, s.data(), static_cast<int>(s.size()), SQLITE_TRANSIENT);
  }
  void Int(int i, int64_t v) { sqlite3_bind_int64(stmt_, i, v); }
  void Real(int i, double v) { sqlite3_bind_double(stmt_, i, v); }
  std::string ColumnBytes(int i) {
    const void* data = sqlite3_column_blob(stmt_, i);
    return data == nullptr ? std::string()
                           : std::string(static_cast<const char*>(data),
                                         static_cast<size_t>(sqlite3_column_bytes(stmt_, i)));
  }

 private:
  sqlite3_stmt* stmt_ = nullptr;
  int rc_ = SQLITE_ERROR;
};

int64_t NowUnixMs() { return absl::ToUnixMillis(absl::Now()); }

}  // namespace

absl::StatusOr<std::unique_ptr<JobStore>> JobStore::Open(const std::string& path) {
  // Two coordinators resuming the same jobs would run each twice: the second one refuses.
  const std::string lock_path = path + ".lock";
  const int lock_fd = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open '", lock_path, "': ", strerror(errno)));
  }
  if (flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
    char holder[32] = {};
    (void)!pread(lock_fd, holder, sizeof(holder) - 1, 0);
    close(lock_fd);
    return absl::FailedPreconditionError(
        absl::StrCat("another coordinator (pid ", absl::StripAsciiWhitespace(holder),
                     ") uses the job database '", path, "'; give this one its own --state-dir"));
  }
  const std::string pid = std::to_string(getpid()) + "\n";
  // The pid only serves the message above: failing to write it costs nothing else.
  if (ftruncate(lock_fd, 0) == 0) (void)!pwrite(lock_fd, pid.data(), pid.size(), 0);
  sqlite3* db = nullptr;
  const int rc = sqlite3_open_v2(
      path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    std::string message = db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
    sqlite3_close(db);
    close(lock_fd);
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open the job database '", path, "': ", message));
  }
  std::unique_ptr<JobStore> store(new JobStore(path, db, lock_fd));
  absl::MutexLock lock(&store->mu_);
  // A second coordinator on the same state directory would wait here instead of failing at once.
  sqlite3_busy_timeout(db, 5000);
  if (absl::Status s = store->Exec("PRAGMA journal_mode=WAL", "set WAL mode"); !s.ok()) return s;
  if (absl::Status s = store->Exec("PRAGMA synchronous=NORMAL", "set synchronous"); !s.ok())
    return s;
  if (absl::Status s = store->Exec(kSchema, "create the schema"); !s.ok()) return s;
  Statement version(db, "SELECT value FROM meta WHERE key = 'schema_version'");
  if (!version.ok()) return store->Error("read the schema version");
  if (sqlite3_step(version.get()) == SQLITE_ROW) {
    const std::string v = version.ColumnBytes(0);
    if (v != std::to_string(kSchemaVersion)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the job database '", path, "' has schema version ", v, "; this coordinator reads ",
          kSchemaVersion, ". Use the matching dtrain-coordinator, or move the file away"));
    }
  } else {
    Statement set(db, "INSERT INTO meta (key, value) VALUES ('schema_version', ?)");
    set.Text(1, std::to_string(kSchemaVersion));
    if (!set.ok() || sqlite3_step(set.get()) != SQLITE_DONE)
      return store->Error("write the schema version");
  }
  return store;
}

JobStore::~JobStore() {
  {
    absl::MutexLock lock(&mu_);
    sqlite3_close(db_);
  }
  close(lock_fd_);
}

absl::Status JobStore::Error(const char* what) const {
  return absl::InternalError(
      absl::StrCat("job database '", path_, "': cannot ", what, ": ", sqlite3_errmsg(db_)));
}

absl::Status JobStore::Exec(const char* sql, const char* what) {
  char* error = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &error) != SQLITE_OK) {
    absl::Status s = absl::FailedPreconditionError(absl::StrCat(
        "job database '", path_, "': cannot ", what, ": ", error != nullptr ? error : "?"));
    sqlite3_free(error);
    return s;
  }
  return absl::OkStatus();
}

absl::Status JobStore::Commit(const char* what) {
  absl::Status s = Exec("COMMIT", what);
  // A COMMIT that failed (a full disk) can leave the transaction open, and every later write
  // would then run inside it and never be committed: it is rolled back here.
  if (!s.ok() && sqlite3_get_autocommit(db_) == 0) Exec("ROLLBACK", what).IgnoreError();
  return s;
}

absl::StatusOr<std::vector<JobStore::StoredJob>> JobStore::LoadAll(
    std::vector<std::string>* skipped) {
  absl::MutexLock lock(&mu_);
  std::vector<StoredJob> jobs;
  {
    Statement rows(db_, "SELECT id, spec, status FROM jobs ORDER BY seq");
    if (!rows.ok()) return Error("read jobs");
    int rc;
    while ((rc = sqlite3_step(rows.get())) == SQLITE_ROW) {
      StoredJob job;
      const std::string id = rows.ColumnBytes(0);
      if (!job.spec.ParseFromString(rows.ColumnBytes(1)) ||
          !job.status.ParseFromString(rows.ColumnBytes(2)) || job.status.id() != id) {
        skipped->push_back(id);
        continue;
      }
      jobs.push_back(std::move(job));
    }
    if (rc != SQLITE_DONE) return Error("read jobs");
  }
  return jobs;
}

absl::StatusOr<std::vector<v1::MetricPoint>> JobStore::Points(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  Statement rows(db_,
                 "SELECT name, step, epoch, value, wall_unix_ms FROM metrics "
                 "WHERE job_id = ? ORDER BY rowid");
  if (!rows.ok()) return Error("read metrics");
  rows.Text(1, job_id);
  std::vector<v1::MetricPoint> points;
  int rc;
  while ((rc = sqlite3_step(rows.get())) == SQLITE_ROW) {
    v1::MetricPoint& p = points.emplace_back();
    p.set_name(rows.ColumnBytes(0));
    p.set_step(sqlite3_column_int64(rows.get(), 1));
    p.set_epoch(sqlite3_column_int64(rows.get(), 2));
    p.set_value(sqlite3_column_double(rows.get(), 3));
    p.set_wall_unix_ms(sqlite3_column_int64(rows.get(), 4));
  }
  if (rc != SQLITE_DONE) return Error("read metrics");
  return points;
}

absl::Status JobStore::Insert(const v1::JobSpec& spec, const v1::JobStatus& status) {
  absl::MutexLock lock(&mu_);
  Statement insert(db_,
                   "INSERT INTO jobs (id, state, spec, status, updated_unix_ms) "
                   "VALUES (?, ?, ?, ?, ?)");
  if (!insert.ok()) return Error("insert a job");
  insert.Text(1, status.id());
  insert.Text(2, v1::JobState_Name(status.state()));
  insert.Blob(3, spec.SerializeAsString());
  insert.Blob(4, status.SerializeAsString());
  insert.Int(5, NowUnixMs());
  if (sqlite3_step(insert.get()) != SQLITE_DONE) return Error("insert a job");
  return absl::OkStatus();
}

absl::Status JobStore::Update(const v1::JobStatus& status) {
  absl::MutexLock lock(&mu_);
  Statement update(db_, "UPDATE jobs SET state = ?, status = ?, updated_unix_ms = ? WHERE id = ?");
  if (!update.ok()) return Error("update a job");
  update.Text(1, v1::JobState_Name(status.state()));
  update.Blob(2, status.SerializeAsString());
  update.Int(3, NowUnixMs());
  update.Text(4, status.id());
  if (sqlite3_step(update.get()) != SQLITE_DONE) return Error("update a job");
  return absl::OkStatus();
}

absl::Status JobStore::AddMetrics(const std::string& job_id,
                                  const std::vector<v1::MetricPoint>& points) {
  if (points.empty()) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  if (absl::Status s = Exec("BEGIN IMMEDIATE", "insert metrics"); !s.ok()) return s;
  Statement insert(db_,
                   "INSERT INTO metrics (job_id, name, step, epoch, value, wall_unix_ms) "
                   "VALUES (?, ?, ?, ?, ?, ?)");
  bool ok = insert.ok();
  for (size_t i = 0; ok && i < points.size(); ++i) {
    const v1::MetricPoint& point = points[i];
    sqlite3_reset(insert.get());
    insert.Text(1, job_id);
    insert.Text(2, point.name());
    insert.Int(3, point.step());
    insert.Int(4, point.epoch());
    insert.Real(5, point.value());
    insert.Int(6, point.wall_unix_ms());
    ok = sqlite3_step(insert.get()) == SQLITE_DONE;
  }
  if (!ok) {
    absl::Status error = Error("insert metrics");
    Exec("ROLLBACK", "insert metrics").IgnoreError();
    return error;
  }
  return Commit("insert metrics");
}

absl::Status JobStore::Delete(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  // One transaction: a job is never left half forgotten.
  if (absl::Status s = Exec("BEGIN IMMEDIATE", "delete a job"); !s.ok()) return s;
  for (const char* sql :
       {"DELETE FROM metrics WHERE job_id = ?", "DELETE FROM jobs WHERE id = ?"}) {
    Statement remove(db_, sql);
    if (!remove.ok()) {
      Exec("ROLLBACK", "delete a job").IgnoreError();
      return Error("delete a job");
    }
    remove.Text(1, job_id);
    if (sqlite3_step(remove.get()) != SQLITE_DONE) {
      absl::Status error = Error("delete a job");
      Exec("ROLLBACK", "delete a job").IgnoreError();
      return error;
    }
  }
  return Commit("delete a job");
}

}  // namespace dtrain
