// Shard lists (common/shard_list.h): WebDataset's brace notation and list files, including the
// hostile ones: counts and lengths refused before anything is allocated.
#include "common/shard_list.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>

namespace dtrain {
namespace shard_list_test {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(ShardPattern, ZeroPaddedRange_AsWebDatasetWritesThem) {
  absl::StatusOr<std::vector<std::string>> names = ExpandShardPattern("train-{000008..000011}.tar");
  ASSERT_TRUE(names.ok()) << names.status();
  EXPECT_THAT(*names, ElementsAre("train-000008.tar", "train-000009.tar", "train-000010.tar",
                                  "train-000011.tar"));
  // Without a leading zero, no padding; padding takes the wider bound.
  EXPECT_THAT(*ExpandShardPattern("s{8..11}"), ElementsAre("s8", "s9", "s10", "s11"));
  EXPECT_THAT(*ExpandShardPattern("s{08..100}"), ::testing::Contains("s008"));
  EXPECT_EQ(ExpandShardPattern("train-{000000..001023}.tar")->size(), 1024u);
  EXPECT_EQ(ExpandShardPattern("train-{000000..001023}.tar")->back(), "train-001023.tar");
}

TEST(ShardPattern, ChoicesAndSeveralGroups_LeftmostVaryingSlowest) {
  EXPECT_THAT(*ExpandShardPattern("https://h/{a,b}/p-{0..2}.tar"),
              ElementsAre("https://h/a/p-0.tar", "https://h/a/p-1.tar", "https://h/a/p-2.tar",
                          "https://h/b/p-0.tar", "https://h/b/p-1.tar", "https://h/b/p-2.tar"));
  EXPECT_THAT(*ExpandShardPattern("/data/one.tar"), ElementsAre("/data/one.tar"));
}

TEST(ShardPattern, Malformed_InvalidArgumentNamingWhereAndWhy) {
  struct Case {
    const char* pattern;
    const char* why;
  } cases[] = {
      {"a{0..3", "'{' without '}' at character 2"},
      {"a}b", "'}' without '{' at character 2"},
      {"a{}b", "empty braces"},
      {"a{5..2}", "must go up"},
      {"a{x..9}", "decimal numbers"},
      {"a{-1..9}", "decimal numbers"},
      {"a{{0..1}}", "do not nest"},
      {"a{0..1234567890123456789}", "decimal numbers"},  // 19 digits: would overflow
  };
  for (const Case& c : cases) {
    absl::StatusOr<std::vector<std::string>> r = ExpandShardPattern(c.pattern);
    ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << c.pattern;
    EXPECT_THAT(r.status().message(), HasSubstr(c.why)) << c.pattern;
    EXPECT_THAT(r.status().message(), HasSubstr(c.pattern)) << c.pattern;
  }
}

TEST(ShardPattern, HugeCounts_RefusedBeforeAllocating) {
  // 10^18 names, or 10^6 x 10^6: refused from the bounds, in no time and no memory.
  for (const char* pattern : {"s{0..999999999999999999}", "{0..999999}-{0..999999}",
                              "{0..9}{0..9}{0..9}{0..9}{0..9}{0..9}{0..9}"}) {
    absl::StatusOr<std::vector<std::string>> r = ExpandShardPattern(pattern);
    ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << pattern;
    EXPECT_THAT(r.status().message(), HasSubstr("more than 1048576 shards")) << pattern;
  }
  EXPECT_EQ(ExpandShardPattern("{0..9}{0..9}", 99).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ExpandShardPattern("{0..9}{0..9}", 100)->size(), 100u);
  const std::string long_name(kMaxShardNameBytes, 'x');
  EXPECT_THAT(ExpandShardPattern(long_name + "{0..1}").status().message(),
              HasSubstr("makes names of 4097 bytes"));
}

TEST(ShardPattern, BytesOfNamesInAll_RefusedBeforeAllocating) {
  // Each bound alone holds (a million names, each under 4,096 bytes), but together they would
  // make 4 GiB of names from a 4 KB line.
  const std::string wide(4000, 'a');
  absl::StatusOr<std::vector<std::string>> r = ExpandShardPattern(wide + "{0..1048575}");
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      r.status().message(),
      HasSubstr("bytes of names, over the 268435456 allowed here (name fewer or shorter shards"));
  // Exactly at the bound: 10 names of 3 bytes.
  EXPECT_EQ(ExpandShardPattern("ab{0..9}", 100, 30)->size(), 10u);
  EXPECT_THAT(ExpandShardPattern("ab{0..9}", 100, 29).status().message(),
              HasSubstr("makes 30 bytes of names, over the 29 allowed here"));
  // A range's values count at their own digits, padded ones at the padding: 8, 9, 10, 11 make
  // 6 bytes, 08 to 11 make 8.
  EXPECT_EQ(ExpandShardPattern("{8..11}", 100, 6)->size(), 4u);
  EXPECT_THAT(ExpandShardPattern("{8..11}", 100, 5).status().message(), HasSubstr("makes 6 bytes"));
  EXPECT_EQ(ExpandShardPattern("{08..11}", 100, 8)->size(), 4u);
  EXPECT_THAT(ExpandShardPattern("{08..11}", 100, 7).status().message(),
              HasSubstr("makes 8 bytes"));
  // Choices count at their own lengths, each once per name of the other groups.
  EXPECT_EQ(ExpandShardPattern("{a,bbb}-{0,1}", 100, 16)->size(), 4u);
  EXPECT_EQ(ExpandShardPattern("{a,bbb}-{0,1}", 100, 15).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Any max_names: a sum past 2^64 is refused, not wrapped.
  EXPECT_THAT(ExpandShardPattern(std::string(4000, 'x') + "{0..99999999999999999}",
                                 std::numeric_limits<size_t>::max())
                  .status()
                  .message(),
              HasSubstr("makes more than 2^64 bytes of names"));
}

TEST(ShardList, LinesWithDigestsCommentsAndPatterns) {
  const std::string digest = "sha256:" + std::string(64, 'a');
  absl::StatusOr<std::vector<ShardEntry>> list = ParseShardList(
      "# ImageNet, first shards\n\n  https://h/a.tar  " + digest + "\nworker:/d/b-{1..2}.tar\r\n");
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->size(), 3u);
  EXPECT_EQ((*list)[0].location, "https://h/a.tar");
  EXPECT_EQ((*list)[0].digest, digest);
  EXPECT_EQ((*list)[1].location, "worker:/d/b-1.tar");
  EXPECT_EQ((*list)[1].digest, "");
  EXPECT_EQ((*list)[2].location, "worker:/d/b-2.tar");
  EXPECT_EQ((*list)[2].samples, -1);
}

TEST(ShardList, SampleCountsInEitherOrder) {
  const std::string digest = "sha256:" + std::string(64, 'b');
  absl::StatusOr<std::vector<ShardEntry>> list =
      ParseShardList("a.tar samples:1000 " + digest + "\nb.tar samples:7\nc.tar " + digest);
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->size(), 3u);
  EXPECT_EQ((*list)[0].samples, 1000);
  EXPECT_EQ((*list)[0].digest, digest);
  EXPECT_EQ((*list)[1].samples, 7);
  EXPECT_EQ((*list)[1].digest, "");
  EXPECT_EQ((*list)[2].samples, -1);
}

TEST(ShardList, BadLines_InvalidArgumentNamingTheLine) {
  struct Case {
    std::string text;
    const char* want;
  } cases[] = {
      {"a.tar\nb.tar sha256:12\n", "line 2: a digest is sha256: and 64 lowercase hex"},
      {"a.tar md5:" + std::string(32, '0'), "line 1: 'md5:0000"},
      {"a.tar sha256:" + std::string(64, 'A'), "line 1: a digest"},
      {"a.tar x y z", "line 1: expected '<shard> [sha256:<hex>] [samples:<n>]'"},
      {"a.tar x", "line 1: 'x' is neither sha256:<hex> nor samples:<n>"},
      {"a.tar samples:-1", "line 1: a sample count is samples: and a whole number"},
      {"a.tar samples:+3", "line 1: a sample count"},
      {"a.tar samples:1000000000000", "line 1: a sample count"},
      {"a.tar samples:1 samples:2", "line 1: two sample counts"},
      {"a-{0..1}.tar samples:3", "braces would name several"},
      {"a-{0..1}.tar sha256:" + std::string(64, '0'), "braces would name several"},
      {"ok.tar\nbad{.tar", "line 2: shard pattern 'bad{.tar': '{' without '}'"},
      {"# nothing\n\n", "names no shard"},
      {"", "names no shard"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<std::vector<ShardEntry>> r = ParseShardList(c.text);
    ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_THAT(r.status().message(), HasSubstr(c.want)) << c.text;
  }
}

TEST(ShardList, TheBoundCountsEveryLine) {
  EXPECT_EQ(ParseShardList("a{0..4}\nb{0..4}", 10)->size(), 10u);
  absl::StatusOr<std::vector<ShardEntry>> over = ParseShardList("a{0..4}\nb{0..5}", 10);
  ASSERT_EQ(over.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(over.status().message(), HasSubstr("line 2"));
  EXPECT_THAT(ParseShardList("a\nb\nc sha256:" + std::string(64, '0'), 2).status().message(),
              HasSubstr("line 3: more than 2 shards"));
}

TEST(ShardList, TheBytesBoundCountsEveryLine) {
  const std::string digest = " sha256:" + std::string(64, '0');
  EXPECT_EQ(ParseShardList("aaaa\nb{0,1}" + std::string("\ncc") + digest, 10, 10)->size(), 4u);
  absl::StatusOr<std::vector<ShardEntry>> over = ParseShardList("aaaa\nb{0,1}\ncc" + digest, 10, 9);
  ASSERT_EQ(over.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(over.status().message(),
              HasSubstr("line 3: the list's names pass 9 bytes in all (name fewer"));
  over = ParseShardList("aaaa\nb{0,1,2}", 10, 9);
  ASSERT_EQ(over.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      over.status().message(),
      HasSubstr("line 2: shard pattern 'b{0,1,2}' makes 6 bytes of names, over the 5 allowed"));
}

}  // namespace shard_list_test
}  // namespace dtrain
