// JobStore: the coordinator's jobs on disk, in an embedded SQLite database
// (<state_dir>/coordinator.db), so that a restarted coordinator (SIGKILL included) knows every
// job it had: spec, state, reason, progress, metric summaries and checkpoint paths (the
// JobStatus), plus every metric point for `dtrain results`. Logs stay in each job's job.log.
//
// The database runs in WAL mode with synchronous=NORMAL: a committed write survives the
// process being killed (the WAL is in the kernel's page cache), though not necessarily a power
// cut; that is the trade SQLite recommends for WAL and what a job-state cache needs.
//
// Thread-safety: all methods are safe to call concurrently (one connection behind a mutex).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "dtrain/v1/jobs.pb.h"

struct sqlite3;

namespace dtrain {

class JobStore {
 public:
  struct StoredJob {
    v1::JobSpec spec;
    v1::JobStatus status;  // without spec
  };

  // Opens (creating if needed) the database at `path`, locked for this process (`path`.lock).
  // FAILED_PRECONDITION naming the file when it cannot be opened, is not a dtrain database, or
  // another coordinator holds it.
  static absl::StatusOr<std::unique_ptr<JobStore>> Open(const std::string& path);
  ~JobStore();

  // Every job, in submission order. Rows that no longer parse are skipped and named in
  // `skipped` (a damaged row must not keep the coordinator from starting).
  absl::StatusOr<std::vector<StoredJob>> LoadAll(std::vector<std::string>* skipped);

  // A job's metric points, in the order they were added.
  absl::StatusOr<std::vector<v1::MetricPoint>> Points(const std::string& job_id);

  // Inserts a job at submission (its spec is stored once, here).
  absl::Status Insert(const v1::JobSpec& spec, const v1::JobStatus& status);
  // Replaces a job's status.
  absl::Status Update(const v1::JobStatus& status);
  // Points logged together, in one transaction: a training call's points cost one commit (a
  // commit per point was a quarter of the coordinator's time between an MLP job's calls).
  absl::Status AddMetrics(const std::string& job_id, const std::vector<v1::MetricPoint>& points);
  absl::Status AddMetric(const std::string& job_id, const v1::MetricPoint& point) {
    return AddMetrics(job_id, {point});
  }
  // Removes a job and its metric points.
  absl::Status Delete(const std::string& job_id);

  const std::string& path() const { return path_; }

 private:
  JobStore(std::string path, sqlite3* db, int lock_fd)
      : path_(std::move(path)), lock_fd_(lock_fd), db_(db) {}
  // Runs `sql` (no results); the error names `what`.
  absl::Status Exec(const char* sql, const char* what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the open transaction; one whose COMMIT failed is rolled back, not left open.
  absl::Status Commit(const char* what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Error(const char* what) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  const int lock_fd_;  // flock'ed while this store lives
  absl::Mutex mu_;
  sqlite3* const db_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dtrain
