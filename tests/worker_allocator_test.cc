// The worker's allocator as another program receives it (worker/runtime/worker_allocator.h): the
// environment bench/training.sh gives torch's ranks loads jemalloc, whose parser takes every
// option of the worker's. (That the worker itself runs on it: worker_service_test.cc.)
#include "worker/runtime/worker_allocator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/test_support.h"

namespace dtrain::testing {
namespace worker_allocator_test {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(WorkerAllocator, TheEnvironmentLoadsJemalloc_WhichTakesEveryOption) {
  const std::vector<std::string> environment = WorkerAllocatorEnvironment();
  ASSERT_EQ(environment.size(), 2u);
  EXPECT_EQ(environment[1], "MALLOC_CONF=oversize_threshold:0,dirty_decay_ms:-1");
  // abort_conf: jemalloc aborts on an option or value it does not take, where it would only
  // print a warning and go on without it. cat allocates, so jemalloc parses the options.
  const CommandResult run = RunShell("env " + environment[0] + " " + environment[1] +
                                     ",abort_conf:true cat /proc/self/maps");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("/libjemalloc.so.2"));
  EXPECT_THAT(run.output, Not(HasSubstr("<jemalloc>")));
  // The same run catches an option jemalloc does not know.
  const CommandResult misspelt =
      RunShell("env " + environment[0] +
               " MALLOC_CONF=oversize_treshold:0,abort_conf:true cat /proc/self/maps");
  EXPECT_NE(misspelt.exit_code, 0);
  EXPECT_THAT(misspelt.output, HasSubstr("Invalid conf pair: oversize_treshold:0"));
}

}  // namespace worker_allocator_test
}  // namespace dtrain::testing
