// Streaming a sharded split (worker/data/epoch_plan.h, shard_catalog.h, sample_stream.h): every
// sample read exactly once per epoch across the ranks, equal training lengths, shuffles that
// depend only on (seed, epoch, rank), resume from a position, and errors that name the shard,
// the sample and the rank, and a stalled stream told from a slow one (stuck_stream_watch.h).
// Real tar shards on disk, written with libarchive.
#include <archive.h>
#include <archive_entry.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/sha256.h"
#include "tests/test_support.h"
#include "worker/data/epoch_plan.h"
#include "worker/data/sample_stream.h"
#include "worker/data/shard_catalog.h"
#include "worker/data/stuck_stream_watch.h"

namespace dtrain {
namespace shard_stream_test {

using ::testing::HasSubstr;

// Shard `s` holds samples "s<s>_<i>" with a .cls field "<s*1000+i>" (and a .txt field).
std::string WriteShard(const std::string& dir, int s, int samples) {
  const std::string path = absl::StrCat(dir, "/part-", s, ".tar");
  struct archive* a = archive_write_new();
  archive_write_set_format_pax_restricted(a);
  EXPECT_EQ(archive_write_open_filename(a, path.c_str()), ARCHIVE_OK);
  for (int i = 0; i < samples; ++i) {
    for (const char* ext : {"cls", "txt"}) {
      const std::string bytes = absl::StrCat(s * 1000 + i);
      struct archive_entry* e = archive_entry_new();
      archive_entry_set_pathname(e, absl::StrCat("s", s, "_", i, ".", ext).c_str());
      archive_entry_set_filetype(e, AE_IFREG);
      archive_entry_set_perm(e, 0644);
      archive_entry_set_size(e, static_cast<int64_t>(bytes.size()));
      archive_write_header(a, e);
      archive_write_data(a, bytes.data(), bytes.size());
      archive_entry_free(e);
    }
  }
  archive_write_close(a);
  archive_write_free(a);
  return path;
}

std::string MakeDir(const std::string& name, const std::vector<int>& sizes) {
  const std::string dir = testing::TestTempPath(name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  for (size_t s = 0; s < sizes.size(); ++s) WriteShard(dir, static_cast<int>(s), sizes[s]);
  return dir;
}

std::vector<std::string> Keys(SampleStream& stream, absl::Status* status = nullptr) {
  std::vector<std::string> keys;
  int64_t last = -1;
  while (true) {
    absl::StatusOr<std::optional<StreamItem>> item = stream.Next();
    if (!item.ok()) {
      if (status != nullptr) *status = item.status();
      return keys;
    }
    if (!item->has_value()) return keys;
    if (!keys.empty()) {
      EXPECT_EQ((*item)->position, last + 1);  // positions count up by one
    }
    last = (*item)->position;
    keys.push_back((*item)->error.ok() ? (*item)->sample.key : "<missing>");
  }
}

TEST(EpochPlan, EveryTrainingRankGetsTheSameLengthAndNoSampleTwice) {
  const std::vector<int64_t> shards = {10, 7, 13, 1, 9};  // 40 samples
  for (int world : {1, 3, 4, 7}) {
    for (int64_t epoch : {0, 1, 2}) {
      std::set<std::pair<int64_t, int64_t>> seen;
      for (int rank = 0; rank < world; ++rank) {
        EpochPlanInput in{shards, world, rank, true, true, 42, epoch};
        int64_t taken = 0;
        for (const ShardSegment& s : PlanRankEpoch(in)) {
          for (int64_t i = s.skip; i < s.skip + s.take; ++i) {
            EXPECT_TRUE(seen.insert({s.shard, i}).second) << world << " " << rank;
          }
          taken += s.take;
        }
        EXPECT_EQ(taken, 40 / world) << world;
      }
      EXPECT_EQ(static_cast<int64_t>(seen.size()), 40 / world * world);
    }
  }
}

TEST(EpochPlan, EvaluationCountsEverySampleOnce) {
  const std::vector<int64_t> shards = {10, 7, 13, 1, 9};
  for (int world : {1, 3, 6}) {
    std::set<std::pair<int64_t, int64_t>> seen;
    for (int rank = 0; rank < world; ++rank) {
      EpochPlanInput in{shards, world, rank, false, true, 42, 3};
      for (const ShardSegment& s : PlanRankEpoch(in)) {
        for (int64_t i = s.skip; i < s.skip + s.take; ++i)
          EXPECT_TRUE(seen.insert({s.shard, i}).second);
      }
    }
    EXPECT_EQ(seen.size(), 40u) << world;
  }
}

TEST(EpochPlan, ShardOrderDependsOnSeedAndEpochOnly) {
  EXPECT_EQ(EpochShardOrder(100, true, 7, 3), EpochShardOrder(100, true, 7, 3));
  EXPECT_NE(EpochShardOrder(100, true, 7, 3), EpochShardOrder(100, true, 7, 4));
  EXPECT_NE(EpochShardOrder(100, true, 7, 3), EpochShardOrder(100, true, 8, 3));
  std::vector<int64_t> sorted = EpochShardOrder(100, true, 7, 3);
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, EpochShardOrder(100, false, 7, 3));
  EXPECT_EQ(EpochShardOrder(5, false, 7, 3), (std::vector<int64_t>{0, 1, 2, 3, 4}));
}

TEST(EpochPlan, ShuffleBufferPermutesWithinItsWindow) {
  ShuffleBuffer<int> buffer(8, 1);
  std::vector<int> out;
  for (int i = 0; i < 100; ++i) {
    if (std::optional<int> x = buffer.Push(i)) {
      EXPECT_LE(*x, i);  // nothing leaves before it came in
      out.push_back(*x);
    }
  }
  while (std::optional<int> x = buffer.Drain()) out.push_back(*x);
  ASSERT_EQ(out.size(), 100u);
  std::vector<int> sorted = out;
  std::sort(sorted.begin(), sorted.end());
  for (int i = 0; i < 100; ++i) EXPECT_EQ(sorted[i], i);
  int moved = 0;
  for (int i = 0; i < 100; ++i) moved += out[i] != i;
  EXPECT_GT(moved, 50);
}

TEST(ShardCatalog, DirectoryPatternAndListAgreeAndCount) {
  const std::string dir = MakeDir("catalog", {5, 3, 4});
  absl::StatusOr<ShardCatalog> by_dir = ResolveShards("worker:" + dir, "train", {});
  ASSERT_TRUE(by_dir.ok()) << by_dir.status();
  ASSERT_EQ(by_dir->shards.size(), 3u);
  EXPECT_EQ(by_dir->samples, 12);
  EXPECT_EQ(by_dir->shards[1].samples, 3);
  EXPECT_EQ(by_dir->shards[1].location, "worker:" + dir + "/part-1.tar");
  absl::StatusOr<ShardCatalog> by_pattern =
      ResolveShards("worker:" + dir + "/part-{0..2}.tar", "train", {});
  ASSERT_TRUE(by_pattern.ok()) << by_pattern.status();
  EXPECT_EQ(by_pattern->samples, 12);
  {
    std::ofstream list(dir + "/train.txt");
    list << "# three shards\npart-0.tar samples:5\npart-1.tar samples:3 "
         << *Sha256OfFile(dir + "/part-1.tar") << "\n"
         << dir << "/part-2.tar\n";
  }
  absl::StatusOr<ShardCatalog> by_list = ResolveShards("worker:" + dir + "/train.txt", "t", {});
  ASSERT_TRUE(by_list.ok()) << by_list.status();
  EXPECT_EQ(by_list->samples, 12);
  EXPECT_EQ(by_list->shards[0].location, "worker:" + dir + "/part-0.tar");
  EXPECT_EQ(by_list->shards[2].location, dir + "/part-2.tar");

  absl::StatusOr<ShardCatalog> missing = ResolveShards("worker:" + dir + "/nope.txt", "f", {});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("f: shard list 'worker:" + dir + "/nope.txt'"));
  absl::StatusOr<ShardCatalog> remote =
      ResolveShards("https://127.0.0.1:1/d/part-{0..1}.tar", "spec.data.shards.train", {});
  EXPECT_EQ(remote.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(remote.status().message(), HasSubstr("has no sample count"));
}

// A local shard's digest is checked when it is opened; a checked file is not hashed again each
// epoch, but a file changed since it was checked is.
TEST(ShardCatalog, ALocalShardsDigestIsCheckedAndAChangeIsSeen) {
  const std::string dir = MakeDir("digest", {4, 2});
  const std::string path = dir + "/part-0.tar";
  const CatalogShard shard{"worker:" + path, *Sha256OfFile(path), 4};
  for (int epoch = 0; epoch < 2; ++epoch) {
    absl::StatusOr<LocalShard> local = FetchShard(shard, {}, nullptr);
    ASSERT_TRUE(local.ok()) << local.status();
    EXPECT_EQ(local->path, path);
  }
  std::filesystem::copy_file(dir + "/part-1.tar", path,
                             std::filesystem::copy_options::overwrite_existing);
  absl::StatusOr<LocalShard> changed = FetchShard(shard, {}, nullptr);
  EXPECT_EQ(changed.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(changed.status().message(), HasSubstr("the shard list says " + shard.digest));
  const CatalogShard wrong{"worker:" + dir + "/part-1.tar", shard.digest, 2};
  EXPECT_EQ(FetchShard(wrong, {}, nullptr).status().code(), absl::StatusCode::kDataLoss);
}

SampleStreamOptions Options(const ShardCatalog& catalog, int world, int rank, int64_t epoch) {
  SampleStreamOptions o;
  o.catalog = &catalog;
  o.plan.world = world;
  o.plan.rank = rank;
  o.plan.seed = 5;
  o.plan.epoch = epoch;
  o.shuffle_buffer = 6;
  return o;
}

TEST(SampleStream, RanksReadDisjointShuffledChunksAndResumeExactly) {
  const std::string dir = MakeDir("stream", {5, 3, 4, 6, 2});  // 20 samples
  absl::StatusOr<ShardCatalog> catalog = ResolveShards(dir, "train", {});
  ASSERT_TRUE(catalog.ok()) << catalog.status();
  std::set<std::string> all;
  std::vector<std::string> rank1_epoch0;
  for (int rank = 0; rank < 3; ++rank) {
    SampleStream stream(Options(*catalog, 3, rank, 0));
    std::vector<std::string> keys = Keys(stream);
    EXPECT_EQ(keys.size(), 6u);
    EXPECT_EQ(stream.epoch_samples(), 6);
    for (const std::string& k : keys) EXPECT_TRUE(all.insert(k).second) << k;
    if (rank == 1) rank1_epoch0 = keys;
  }
  EXPECT_EQ(all.size(), 18u);
  // The same (seed, epoch, rank): the same order; another epoch: another.
  SampleStream again(Options(*catalog, 3, 1, 0));
  EXPECT_EQ(Keys(again), rank1_epoch0);
  SampleStream next_epoch(Options(*catalog, 3, 1, 1));
  EXPECT_NE(Keys(next_epoch), rank1_epoch0);
  // Starting at position 4 hands out exactly the tail of the uninterrupted order.
  SampleStreamOptions from4 = Options(*catalog, 3, 1, 0);
  from4.start = 4;
  SampleStream resumed(from4);
  EXPECT_EQ(Keys(resumed), std::vector<std::string>(rank1_epoch0.begin() + 4, rank1_epoch0.end()));
}

TEST(SampleStream, ATruncatedShardIsNamedOrSkippedSampleBySample) {
  const std::string dir = MakeDir("truncated", {4, 4});
  // The second shard loses its end (and so its last samples and the tar trailer).
  const std::string victim = dir + "/part-1.tar";
  std::filesystem::resize_file(victim, 4096 + 512);  // s1_0 whole, s1_1 cut
  ShardCatalog catalog;
  catalog.shards = {{dir + "/part-0.tar", "", 4}, {victim, "", 4}};
  catalog.samples = 8;
  SampleStreamOptions o = Options(catalog, 1, 0, 0);
  o.plan.shuffle = false;
  o.shuffle_buffer = 0;
  SampleStream failing(o);
  absl::Status status;
  std::vector<std::string> keys = Keys(failing, &status);
  EXPECT_EQ(keys.size(), 4u + 1u);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("rank 0, shard '" + victim + "'"));

  o.skip_errors = true;
  SampleStream skipping(o);
  keys = Keys(skipping, &status);
  ASSERT_EQ(keys.size(), 8u);
  EXPECT_EQ(keys[0], "s0_0");
  EXPECT_EQ(std::count(keys.begin(), keys.end(), "<missing>"), 3);

  catalog.shards[1].location = dir + "/gone.tar";
  SampleStream gone(o);
  keys = Keys(gone, &status);
  EXPECT_EQ(std::count(keys.begin(), keys.end(), "<missing>"), 4);
}

// Stuck means no progress for stuck_after since the later of the wait's start and the last
// progress; a sample the stream reads is progress, seen when the watch looks.
TEST(StuckStreamWatch, CountsFromTheLaterOfTheWaitAndTheLastProgress) {
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  StuckStreamWatch watch(absl::Seconds(10));
  watch.Restart(t0);
  EXPECT_FALSE(watch.Stuck(nullptr, t0, t0 + absl::Seconds(10)));
  EXPECT_TRUE(watch.Stuck(nullptr, t0, t0 + absl::Seconds(11)));
  // A wait that began later counts from its own start.
  EXPECT_FALSE(watch.Stuck(nullptr, t0 + absl::Seconds(5), t0 + absl::Seconds(11)));
  watch.Progressed(t0 + absl::Seconds(20));
  EXPECT_FALSE(watch.Stuck(nullptr, t0, t0 + absl::Seconds(29)));
  EXPECT_TRUE(watch.Stuck(nullptr, t0, t0 + absl::Seconds(31)));

  // A real stream: reading a sample between two looks is progress, dated by the second look.
  const std::string dir = MakeDir("watch", {3});
  absl::StatusOr<ShardCatalog> catalog = ResolveShards(dir, "train", {});
  ASSERT_TRUE(catalog.ok()) << catalog.status();
  SampleStream stream(Options(*catalog, 1, 0, 0));
  watch.Restart(t0);
  EXPECT_TRUE(watch.Stuck(&stream, t0, t0 + absl::Seconds(11)));
  ASSERT_TRUE(stream.Next().ok());
  EXPECT_FALSE(watch.Stuck(&stream, t0, t0 + absl::Seconds(12)));  // read: progress at t0+12
  EXPECT_FALSE(watch.Stuck(&stream, t0, t0 + absl::Seconds(22)));
  EXPECT_TRUE(watch.Stuck(&stream, t0, t0 + absl::Seconds(23)));  // nothing read since

  const absl::Status error = watch.Error(3, "train", 42);
  EXPECT_EQ(error.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(error.message(), HasSubstr("rank 3: the train stream"));
  EXPECT_THAT(error.message(), HasSubstr("in 10s (waiting for position 42)"));
}

}  // namespace shard_stream_test
}  // namespace dtrain
