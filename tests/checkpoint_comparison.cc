#include "tests/checkpoint_comparison.h"

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"

namespace dtrain::testing {

std::string RunToTheEnd(LocalCluster& cluster, const std::string& name, const std::string& yaml,
                        absl::Duration timeout) {
  const std::string id = cluster.Submit(name, yaml);
  EXPECT_FALSE(id.empty()) << "the coordinator refused " << name;
  if (id.empty()) return "";
  EXPECT_TRUE(WaitFor([&] { return IsTerminal(cluster.GetJob(id).state()); }, timeout))
      << id << " did not end within " << timeout;
  const v1::JobStatus done = cluster.GetJob(id);
  EXPECT_EQ(done.state(), v1::SUCCEEDED) << id << ": " << done.reason();
  // The job's workers are let go just after its end: a test that counts on an idle spare next
  // must not find one of them still held.
  EXPECT_TRUE(
      WaitFor([&] { return cluster.AliveWorkers(/*idle_only=*/true) == cluster.AliveWorkers(); },
              absl::Seconds(30)))
      << "the workers of " << id << " were not let go";
  return done.state() == v1::SUCCEEDED ? id : "";
}

std::string DownloadCheckpoint(LocalCluster& cluster, const std::string& job,
                               const std::string& which) {
  const std::string dir = absl::StrCat(cluster.dir(), "/downloads/", job);
  const CommandResult download =
      cluster.Dtrain(absl::StrCat("download ", job, " ", which, " --output json -o ", dir));
  EXPECT_EQ(download.exit_code, 0) << download.output;
  // {"files": [{"name": ..., "path": "<dir>/<name>", ...}]}
  const std::string key = "\"path\": \"";
  const size_t at = download.output.find(key);
  if (download.exit_code != 0 || at == std::string::npos) return "";
  const size_t start = at + key.size();
  return download.output.substr(start, download.output.find('"', start) - start);
}

::testing::AssertionResult SameTrainingState(const std::string& a, const std::string& b) {
  const CommandResult compared = RunShell(absl::StrCat(
      "/usr/bin/python3 " DTRAIN_SOURCE_DIR "/tests/compare_checkpoints.py '", a, "' '", b, "'"));
  if (compared.exit_code == 0) return ::testing::AssertionSuccess() << compared.output;
  return ::testing::AssertionFailure() << compared.output;
}

::testing::AssertionResult SameFinalState(LocalCluster& cluster, const std::string& job,
                                          const std::string& reference) {
  const std::string a = DownloadCheckpoint(cluster, job);
  const std::string b = DownloadCheckpoint(cluster, reference);
  if (a.empty() || b.empty()) {
    return ::testing::AssertionFailure()
           << "the last checkpoint of " << job << " or " << reference << " could not be downloaded";
  }
  ::testing::AssertionResult same = SameTrainingState(a, b);
  // The report says what was compared: keep it in the test's output either way.
  std::printf("%s vs %s: %s", job.c_str(), reference.c_str(), same.message());
  return same;
}

}  // namespace dtrain::testing
