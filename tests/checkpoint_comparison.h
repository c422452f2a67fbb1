// Recovery judged by its outcome: a job that was interrupted (a coordinator restart, a drain, a
// lost worker, a ckpt_path resume) must end in exactly the training state of a run that was
// not. The reference is a second job of the same spec run to its end on the same cluster; both
// jobs' last checkpoints are downloaded through the coordinator (`dtrain download JOB last`)
// and compared by tests/compare_checkpoints.py under Debian's python3-torch: every tensor of
// state_dict, optimizer_states and lr_schedulers, bit for bit, plus epoch and global_step.
// Bitwise equality is what the planes promise for a fixed world size: every rank reduces in rank
// order (docs/decisions/pending-test-recovery.md says why each plane is deterministic).
#pragma once

#include <string>

#include <gtest/gtest.h>

#include "tests/local_cluster.h"

namespace dtrain::testing {

// Submits `yaml` (stage fit) and waits up to `timeout` for its end, then until every alive
// worker is idle again; the job's id, or "" (with a test failure saying why) when it was
// refused or did not end SUCCEEDED.
std::string RunToTheEnd(LocalCluster& cluster, const std::string& name, const std::string& yaml,
                        absl::Duration timeout = absl::Seconds(180));

// `dtrain download <job> <which> -o <cluster dir>/downloads/<job>`; the local path, or "" (with
// a test failure) when the download failed.
std::string DownloadCheckpoint(LocalCluster& cluster, const std::string& job,
                               const std::string& which = "last");

// Whether the checkpoints at paths `a` and `b` hold the same training state bit for bit; the
// comparison's report either way (what was compared, or every difference).
::testing::AssertionResult SameTrainingState(const std::string& a, const std::string& b);

// Whether `job` ended in the same training state as `reference` (their last checkpoints).
::testing::AssertionResult SameFinalState(LocalCluster& cluster, const std::string& job,
                                          const std::string& reference);

}  // namespace dtrain::testing
