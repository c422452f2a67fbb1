// The coordinator refuses, at start and with exit code 2, flags that would break every job
// later: a collective or registration timeout of zero (every collective or registration failing
// at once) or a negative one, and a heartbeat timeout not above the heartbeat interval.
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "tests/test_support.h"

namespace dtrain::testing {
namespace coordinator_flags_test {

using ::testing::HasSubstr;

TEST(CoordinatorFlags, TimeoutsThatBreakEveryJob_RefusedAtStartNamingTheFlag) {
  const struct {
    std::string flags;
    std::string message;
  } cases[] = {
      {"--collective_timeout=0",
       "--collective_timeout must be a positive, finite duration (got 0)"},
      {"--collective_timeout=-5s",
       "--collective_timeout must be a positive, finite duration (got -5s)"},
      {"--collective_timeout=inf",
       "--collective_timeout must be a positive, finite duration (got inf)"},
      {"--register_timeout=0", "--register_timeout must be a positive, finite duration (got 0)"},
      {"--heartbeat-interval=5s --heartbeat-timeout=5s", "must exceed --heartbeat-interval"},
  };
  for (const auto& c : cases) {
    CommandResult refused =
        RunShell(absl::StrCat(DTRAIN_COORDINATOR_BIN, " --listen=127.0.0.1:0 ", c.flags, " 2>&1"));
    EXPECT_EQ(refused.exit_code, 2) << c.flags << "\n" << refused.output;
    EXPECT_THAT(refused.output, HasSubstr(c.message)) << c.flags;
  }
}

}  // namespace coordinator_flags_test
}  // namespace dtrain::testing
