// The worker's --cpus: the cpu list syntax both ways, checking against the cores this process
// may use, pinning a thread, and how ddp_spawn's children split a worker's cores.
#include "worker/runtime/cpu_affinity.h"

#include <sched.h>

#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace dtrain {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(CpuList, ParsesTasksetSyntax_SortedWithoutDuplicates) {
  EXPECT_THAT(ParseCpuList("3").value(), ElementsAre(3));
  EXPECT_THAT(ParseCpuList("0-3").value(), ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(ParseCpuList("6,0-2,1,4-4").value(), ElementsAre(0, 1, 2, 4, 6));
  for (const auto& [text, message] : std::vector<std::pair<std::string, std::string>>{
           {"", "empty"},
           {"a", "'a' is not a cpu number"},
           {"1,", "'' is not a cpu number"},
           {"-1", "'' is not a cpu number"},
           {"+1", "'+1' is not a cpu number"},
           {"5-2", "the range '5-2' runs backwards"},
           {"1-2-3", "'2-3' is not a cpu number"},
           {"99999", "'99999' is not a cpu number in [0, 1023]"}}) {
    auto parsed = ParseCpuList(text);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr(message)) << text;
  }
}

TEST(CpuList, FormatsTheShortestList_AndReadsBack) {
  EXPECT_EQ(FormatCpuList({}), "");
  EXPECT_EQ(FormatCpuList({5}), "5");
  EXPECT_EQ(FormatCpuList({0, 1, 2, 5, 7, 8}), "0-2,5,7-8");
  EXPECT_THAT(ParseCpuList(FormatCpuList({0, 1, 2, 5, 7, 8})).value(),
              ElementsAre(0, 1, 2, 5, 7, 8));
}

TEST(CpuList, CheckedAgainstTheCoresThisProcessMayUse) {
  auto allowed = AllowedCpus();
  ASSERT_TRUE(allowed.ok()) << allowed.status();
  ASSERT_FALSE(allowed->empty());
  EXPECT_EQ(CheckCpuList(FormatCpuList(*allowed)).value(), *allowed);
  auto outside = CheckCpuList("1023");
  if (allowed->back() != 1023) {
    EXPECT_EQ(outside.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(outside.status().message()),
                HasSubstr("may not run on cpu(s) 1023; it may run on " + FormatCpuList(*allowed)));
  }
}

TEST(CpuAffinity, PinsOnlyTheCallingThread_AndWhatItStartsAfter) {
  auto allowed = AllowedCpus();
  ASSERT_TRUE(allowed.ok());
  const int cpu = allowed->back();
  std::vector<int> seen_by_child;
  std::thread pinned([&] {
    ASSERT_TRUE(PinCurrentThread({cpu}).ok());
    EXPECT_EQ(AllowedCpus().value(), std::vector<int>{cpu});
    std::thread child([&] { seen_by_child = AllowedCpus().value(); });
    child.join();
  });
  pinned.join();
  EXPECT_EQ(seen_by_child, std::vector<int>{cpu}) << "a thread inherits its creator's mask";
  EXPECT_EQ(AllowedCpus().value(), *allowed) << "the test's own thread stays free";
  EXPECT_TRUE(PinCurrentThread({}).ok()) << "nothing to pin is not an error";
}

TEST(CpuAffinity, SpawnedChildrenSplitTheCoresInEqualRuns) {
  const std::vector<int> eight = {0, 1, 2, 3, 4, 5, 6, 7};
  EXPECT_THAT(CpusOfLocalProcess(eight, 0, 2), ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(CpusOfLocalProcess(eight, 1, 2), ElementsAre(4, 5, 6, 7));
  EXPECT_THAT(CpusOfLocalProcess(eight, 2, 3), ElementsAre(4, 5)) << "7th and 8th left over";
  EXPECT_THAT(CpusOfLocalProcess({2, 9}, 1, 2), ElementsAre(9));
  EXPECT_EQ(CpusOfLocalProcess({0, 1}, 0, 3), (std::vector<int>{0, 1}))
      << "fewer cores than children: each may use all";
  EXPECT_TRUE(CpusOfLocalProcess({}, 0, 2).empty());
}

}  // namespace
}  // namespace dtrain
