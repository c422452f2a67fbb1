// The worker's --cpus: the cpu list syntax both ways, checking against the cores this process
// may use, pinning a thread, how ddp_spawn's children split a worker's cores, and where a
// worker with --cpus=auto places its steps among the other workers of its host.
#include "worker/runtime/cpu_affinity.h"
#include "worker/runtime/cpu_placement.h"

#include <sched.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace dtrain {
namespace cpu_affinity_test {

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

LocalWorker Auto(const std::string& name, std::vector<int> allowed) {
  return {name, std::move(allowed), {}, true};
}
// Pinned by hand to `pinned`, or not pinned at all (--cpus=none) when it is empty.
LocalWorker ByHand(const std::string& name, std::vector<int> allowed, std::vector<int> pinned) {
  return {name, std::move(allowed), std::move(pinned), false};
}

TEST(CpuPlacement, AloneItTakesEveryCore_ThreadsFollowTheSliceOrTheFlag) {
  const CpuPlacement alone = PlaceSteps("a", {0, 1, 2, 3}, 0, {});
  EXPECT_THAT(alone.cpus, ElementsAre(0, 1, 2, 3));
  EXPECT_EQ(alone.threads, 4);
  EXPECT_FALSE(alone.shared);
  EXPECT_THAT(alone.reason, HasSubstr("the only auto-placed worker on cores 0-3"));
  EXPECT_EQ(PlaceSteps("a", {0, 1, 2, 3}, 2, {}).threads, 2);
  EXPECT_EQ(PlaceSteps("a", {0, 1}, 8, {}).threads, 2) << "never more threads than cores";
}

TEST(CpuPlacement, AutoWorkersSplitTheCoresInNameOrder_EachComputingTheSameSplit) {
  const LocalWorker a = Auto("a", {0, 1});
  const LocalWorker b = Auto("b", {0, 1});
  const CpuPlacement for_a = PlaceSteps("a", {0, 1}, 0, {b});
  const CpuPlacement for_b = PlaceSteps("b", {0, 1}, 0, {a});
  EXPECT_THAT(for_a.cpus, ElementsAre(0));
  EXPECT_THAT(for_b.cpus, ElementsAre(1));
  EXPECT_EQ(for_a.threads, 1);
  EXPECT_EQ(for_b.threads, 1);
  EXPECT_THAT(for_b.reason, HasSubstr("2 auto-placed workers on cores 0-1: this one takes 1"));
  // Four cores, three workers: equal runs of one, the fourth core left over.
  const LocalWorker c = Auto("c", {0, 1, 2, 3});
  EXPECT_THAT(PlaceSteps("c", {0, 1, 2, 3}, 0, {a, b}).cpus, ElementsAre(2));
  // A peer listed twice, or this worker listed among the others, counts once.
  EXPECT_THAT(PlaceSteps("b", {0, 1}, 0, {a, a, b}).cpus, ElementsAre(1));
}

TEST(CpuPlacement, CoresPinnedByHandAreLeftToTheirWorker_DisjointCpusetsIgnored) {
  const LocalWorker by_hand = ByHand("h", {0, 1, 2, 3}, {0});
  const LocalWorker other = Auto("z", {0, 1, 2, 3});
  const CpuPlacement p = PlaceSteps("a", {0, 1, 2, 3}, 0, {by_hand, other});
  EXPECT_THAT(p.cpus, ElementsAre(1)) << "cores 1-3 between a and z: one each";
  EXPECT_THAT(PlaceSteps("z", {0, 1, 2, 3}, 0, {by_hand, Auto("a", {0, 1, 2, 3})}).cpus,
              ElementsAre(2));
  EXPECT_THAT(p.reason, HasSubstr("(0 pinned to others by hand)"));
  // A worker in another container's cpuset does not share these cores.
  const LocalWorker elsewhere = Auto("0", {2, 3});
  EXPECT_THAT(PlaceSteps("a", {0, 1}, 0, {elsewhere}).cpus, ElementsAre(0, 1));
}

TEST(CpuPlacement, ACpuQuotaCapsTheThreads) {
  const CpuPlacement p = PlaceSteps("a", {0, 1, 2, 3, 4, 5, 6, 7}, 0, {}, 2.5);
  EXPECT_EQ(p.cpus.size(), 8u);
  EXPECT_EQ(p.threads, 2);
  EXPECT_THAT(p.reason, HasSubstr("the cgroup's CPU quota is 2.5 cores"));
  EXPECT_EQ(PlaceSteps("a", {0, 1}, 0, {}, 0.5).threads, 1) << "at least one";
  EXPECT_EQ(PlaceSteps("a", {0, 1}, 0, {}, 4).threads, 2) << "a quota above the cores: no cap";
}

TEST(CpuQuota, ReadsV2AndV1Quotas_TheSmallestAlongThePath_NoneIsZero) {
  const std::string dir = ::testing::TempDir() + "/cpu_quota_test";
  std::filesystem::remove_all(dir);
  auto write = [](const std::string& path, const std::string& text) {
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    std::ofstream(path) << text;
  };
  // v2: the pod's cgroup allows 1.5 cores, its parent 4.
  write(dir + "/v2/cgroup", "0::/kubepods/pod1\n");
  write(dir + "/v2/fs/kubepods/pod1/cpu.max", "150000 100000\n");
  write(dir + "/v2/fs/kubepods/cpu.max", "400000 100000\n");
  write(dir + "/v2/fs/cpu.max", "max 100000\n");
  EXPECT_DOUBLE_EQ(CpuQuotaCores(dir + "/v2/fs", dir + "/v2/cgroup"), 1.5);
  // v1 (cpu,cpuacct mounted together): 2 cores; -1 is no quota.
  write(dir + "/v1/cgroup", "4:memory:/x\n3:cpu,cpuacct:/slice/job\n");
  write(dir + "/v1/fs/cpu,cpuacct/slice/job/cpu.cfs_quota_us", "200000\n");
  write(dir + "/v1/fs/cpu,cpuacct/slice/job/cpu.cfs_period_us", "100000\n");
  write(dir + "/v1/fs/cpu,cpuacct/cpu.cfs_quota_us", "-1\n");
  write(dir + "/v1/fs/cpu,cpuacct/cpu.cfs_period_us", "100000\n");
  EXPECT_DOUBLE_EQ(CpuQuotaCores(dir + "/v1/fs", dir + "/v1/cgroup"), 2);
  write(dir + "/none/cgroup", "0::/\n");
  write(dir + "/none/fs/cpu.max", "max 100000\n");
  EXPECT_EQ(CpuQuotaCores(dir + "/none/fs", dir + "/none/cgroup"), 0);
  EXPECT_EQ(CpuQuotaCores(dir + "/missing", dir + "/missing/cgroup"), 0);
  write(dir + "/bad/cgroup", "0::/../../etc\n");
  EXPECT_EQ(CpuQuotaCores(dir + "/bad/fs", dir + "/bad/cgroup"), 0) << "no path out of the tree";
  // This machine's own answer is whatever its cgroup says, but never negative.
  EXPECT_GE(CpuQuotaCores(), 0);
}

TEST(CpuPlacement, MoreWorkersThanCores_NotPinnedOneThreadEach_AndSaysSo) {
  const LocalWorker b = Auto("b", {0, 1});
  const LocalWorker c = Auto("c", {0, 1});
  const CpuPlacement p = PlaceSteps("a", {0, 1}, 0, {b, c});
  EXPECT_TRUE(p.cpus.empty());
  EXPECT_EQ(p.threads, 1);
  EXPECT_TRUE(p.shared);
  EXPECT_THAT(p.reason, HasSubstr("fewer cores than workers"));
  // A worker started with --cpus=none floats over every core: placed, but warned about.
  const LocalWorker floating = ByHand("f", {0, 1}, {});
  const CpuPlacement q = PlaceSteps("a", {0, 1}, 0, {floating});
  EXPECT_THAT(q.cpus, ElementsAre(0, 1));
  EXPECT_TRUE(q.shared);
  EXPECT_THAT(q.reason, HasSubstr("1 other worker(s) here run unpinned"));
}

}  // namespace cpu_affinity_test
}  // namespace dtrain
