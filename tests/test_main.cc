// main() of every test bundle: gtest's own, plus a record of each skipped test appended to the
// file $DTRAIN_SKIP_LOG names. Bundles that run several tests in one process (CHUNK in
// tests/CMakeLists.txt) are one ctest entry for many tests, so ctest's results cannot say which of
// them skipped; tests/check_skips.py reads this record instead, test by test, and fails the run
// on a skip that tests/allowed_skips.txt does not allow.
#include <fcntl.h>
#include <sys/types.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include <gtest/gtest.h>

namespace dtrain::testing {
namespace test_main {

// One line a skip: "<suite>.<test>\t<message>", the message's newlines escaped so that a line is
// a record. One write(2) to an O_APPEND file, so that bundles running side by side do not
// interleave their lines.
class SkipLog : public ::testing::EmptyTestEventListener {
 public:
  explicit SkipLog(std::string path) : path_(std::move(path)) {}

  void OnTestEnd(const ::testing::TestInfo& info) override {
    const ::testing::TestResult* result = info.result();
    if (result == nullptr || !result->Skipped()) return;
    std::string message;
    for (int i = 0; i < result->total_part_count(); ++i) {
      const ::testing::TestPartResult& part = result->GetTestPartResult(i);
      if (part.skipped()) message += part.message();
    }
    std::string line = std::string(info.test_suite_name()) + "." + info.name() + "\t";
    for (const char c : message) {
      if (c == '\\') {
        line += "\\\\";
      } else if (c == '\n') {
        line += "\\n";
      } else if (c == '\t') {
        line += "\\t";
      } else if (c == '\r') {
        line += "\\r";
      } else {
        line += c;
      }
    }
    line += '\n';
    const int fd = open(path_.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0 || write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
      // Not recording a skip would let it pass unseen: the test run fails instead.
      std::fprintf(stderr, "test_main: cannot record the skip of %s.%s in %s\n",
                   info.test_suite_name(), info.name(), path_.c_str());
      failed_ = true;
    }
    if (fd >= 0) close(fd);
  }

  bool failed() const { return failed_; }

 private:
  const std::string path_;
  bool failed_ = false;
};

// Set once RUN_ALL_TESTS has returned. With --dtrain_exit_guard (the chunks' entries pass it), a
// process that exits before then (a test calling exit(0)) fails instead of passing with the rest
// of its chunk never run.
bool finished = false;

void ExitGuard() {
  if (finished) return;
  std::fprintf(stderr,
               "test_main: the process exited while a test ran; the tests after it in this chunk "
               "did not run\n");
  std::fflush(stderr);
  _exit(1);
}

}  // namespace test_main
}  // namespace dtrain::testing

int main(int argc, char** argv) {
  namespace tm = dtrain::testing::test_main;
  bool exit_guard = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--dtrain_exit_guard") != 0) continue;
    exit_guard = true;
    for (int j = i; j + 1 < argc; ++j) argv[j] = argv[j + 1];
    --argc;
    break;
  }
  ::testing::InitGoogleTest(&argc, argv);
  if (exit_guard) std::atexit(&tm::ExitGuard);
  tm::SkipLog* skip_log = nullptr;
  if (const char* path = std::getenv("DTRAIN_SKIP_LOG"); path != nullptr && *path != '\0') {
    skip_log = new tm::SkipLog(path);
    // The listener list owns it.
    ::testing::UnitTest::GetInstance()->listeners().Append(skip_log);
  }
  const int status = RUN_ALL_TESTS();
  tm::finished = true;
  if (skip_log != nullptr && skip_log->failed()) return 1;
  // A filter that names no test (a renamed test in a chunk's list) must not pass as if it ran.
  if (::testing::UnitTest::GetInstance()->test_to_run_count() == 0 &&
      ::testing::GTEST_FLAG(filter) != "*") {
    std::fprintf(stderr, "test_main: --gtest_filter=%s names no test of this executable\n",
                 ::testing::GTEST_FLAG(filter).c_str());
    return 1;
  }
  return status;
}
