// docs/tutorial.md, executed: its file blocks (```python file=NAME, ```yaml file=NAME) are
// written into a directory and its shell blocks run there, in order, as one script against a
// local cluster of two workers, with Debian's python3 and torch. The tutorial's last script
// asserts that the weights it loads back give the job's test accuracy.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "tests/local_cluster.h"

namespace dtrain::testing {
namespace tutorial_test {

using ::testing::HasSubstr;

TEST(Tutorial, EveryCommandRuns_WeightsComeBackWithTheJobsTestAccuracy) {
  LocalCluster cluster(absl::StrCat(::testing::TempDir(), "/tutorial-", getpid()));
  ASSERT_TRUE(cluster.StartCoordinator());
  ASSERT_TRUE(cluster.AddWorker("w0"));
  ASSERT_TRUE(cluster.AddWorker("w1"));
  ASSERT_TRUE(WaitFor([&] { return cluster.AliveWorkers(true) == 2; }, absl::Seconds(10)));

  const std::string dir = cluster.dir() + "/tutorial";
  std::filesystem::create_directories(dir);
  std::ifstream doc(DTRAIN_SOURCE_DIR "/docs/tutorial.md");
  ASSERT_TRUE(doc.good());
  std::string script = "set -euo pipefail\n";
  int files = 0, commands = 0;
  std::string line;
  while (std::getline(doc, line)) {
    if (!absl::StartsWith(line, "```") || line == "```") continue;
    const std::string info(absl::StripPrefix(line, "```"));
    std::string body;
    for (std::string l; std::getline(doc, l) && l != "```";) body += l + "\n";
    const size_t file_at = info.find("file=");
    if (file_at != std::string::npos) {
      std::ofstream(dir + "/" + info.substr(file_at + 5)) << body;
      ++files;
    } else if (info == "sh") {
      script += body;
      ++commands;
    }
  }
  EXPECT_GE(files, 4);
  EXPECT_GE(commands, 2);
  std::ofstream(dir + "/tutorial.sh") << script;
  // The tutorial's `dtrain` and `python3`: this build's CLI and Debian's interpreter.
  const std::string cli_dir = std::filesystem::path(DTRAIN_CLI_BIN).parent_path().string();
  CommandResult run = RunShell(
      absl::StrCat("cd ", dir, " && PATH=", cli_dir,
                   ":/usr/bin:$PATH DTRAIN_COORDINATOR=", cluster.address(), " bash tutorial.sh"));
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("the job's weights, back in Python: same test accuracy"));
  EXPECT_THAT(run.output, HasSubstr("\"train_acc\""))
      << "the training_step's acc is logged as train_acc";
  std::printf("%s\n", run.output.c_str());
}

}  // namespace tutorial_test
}  // namespace dtrain::testing
