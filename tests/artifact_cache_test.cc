// The worker's artifact cache on its own, and how a spec names files (common/file_reference):
// each digest fetched once, the least recently used evicted at the size bound, files kept
// across a restart, malformed digests refused. The fetch here writes known bytes; the real
// fetch from a coordinator is tested end to end (job_files_e2e_test.cc).
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/file_reference.h"
#include "common/sha256.h"
#include "worker/service/artifact_cache.h"

namespace dtrain {
namespace artifact_cache_test {

std::string DigestOf(const std::string& bytes) {
  Sha256 hash;
  hash.Update(bytes);
  return hash.Finish();
}

TEST(FileReference, WorkerPathsLoseTheirMark_ArtifactsNameTheirDigest) {
  EXPECT_EQ(WithoutWorkerMark("worker:/data/x.pt"), "/data/x.pt");
  EXPECT_EQ(WithoutWorkerMark("/data/x.pt"), "/data/x.pt");
  EXPECT_TRUE(IsArtifactReference("artifact:sha256:00"));
  EXPECT_EQ(ArtifactDigest(ArtifactReference("sha256:ab")), "sha256:ab");
  EXPECT_TRUE(IsMarkedPath("worker:x") && IsMarkedPath("artifact:x") && !IsMarkedPath("x.pt"));
  EXPECT_TRUE(IsMarkedPath("job:a-1/last.ckpt"));
  std::string job, name;
  EXPECT_TRUE(SplitJobFileReference(JobFileReference("a-1", "epoch=0-step=16.ckpt"), &job, &name));
  EXPECT_EQ(job, "a-1");
  EXPECT_EQ(name, "epoch=0-step=16.ckpt");
  for (const char* bad : {"job:a-1/../x", "job:/last.ckpt", "job:a-1", "job:a-1/sub/x.ckpt"}) {
    EXPECT_FALSE(SplitJobFileReference(bad, &job, &name)) << bad;
  }
  // What a job's file may be called on a worker and on the coordinator.
  EXPECT_TRUE(CheckFileName("epoch=3-step=900.ckpt", "checkpoint").ok());
  EXPECT_TRUE(CheckFileName("predictions.csv", "checkpoint").ok());
  for (const char* bad : {"", ".", "..", "../x", "/etc/passwd", "a/b", ".hidden", "a b", "x\n"}) {
    absl::Status s = CheckFileName(bad, "checkpoint");
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("checkpoint '"));
  }
  EXPECT_FALSE(CheckFileName(std::string(201, 'a'), "checkpoint").ok());
}

// A corrupted or broken transfer is fetched again; one that keeps failing fails by name, never
// leaving a file. A checkpoint this worker wrote joins the cache without a transfer.
TEST(ArtifactCache, CorruptedTransfersTriedAgain_ThenFailedByName_AdoptedFilesNeedNoFetch) {
  const std::string dir =
      ::testing::TempDir() + "/artifact-cache-retry-" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  int calls = 0, failures = 0;
  const std::string bytes(300, 'r');
  const std::string digest = DigestOf(bytes);
  ArtifactCache::Fetcher flaky = [&](const std::string& d, const std::string& path) {
    ++calls;
    if (failures-- > 0) return absl::DataLossError("the fetched bytes hash to another digest");
    std::ofstream(path, std::ios::binary) << bytes;
    return absl::OkStatus();
  };
  ArtifactCache cache(dir, 0, flaky);
  failures = 2;
  absl::StatusOr<std::string> got = cache.Get(digest);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(calls, 3) << "two corrupted transfers, then a good one";
  const std::string other = DigestOf("other");
  failures = 100;
  calls = 0;
  absl::StatusOr<std::string> bad = cache.Get(other);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(calls, ArtifactCache::kFetchAttempts);
  EXPECT_THAT(std::string(bad.status().message()),
              ::testing::HasSubstr("cannot fetch " + other + " from the coordinator (3 attempts)"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/" + other.substr(7)));

  const std::string written = dir + "-job/last.ckpt";
  std::filesystem::create_directories(dir + "-job");
  std::ofstream(written, std::ios::binary) << "checkpoint bytes";
  const std::string ckpt = DigestOf("checkpoint bytes");
  ASSERT_TRUE(cache.Adopt(written, ckpt).ok());
  EXPECT_FALSE(std::filesystem::exists(written)) << "moved, not copied";
  calls = 0;
  const int64_t hits = cache.hits();
  absl::StatusOr<std::string> adopted = cache.Get(ckpt);
  ASSERT_TRUE(adopted.ok()) << adopted.status();
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(cache.hits(), hits + 1);
}

TEST(ArtifactCache, FetchOnce_LeastRecentlyUsedEvicted_KeptAcrossRestarts) {
  const std::string dir = ::testing::TempDir() + "/artifact-cache-" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::map<std::string, std::string> remote;  // digest -> bytes
  for (const char* name : {"a", "b", "c"}) {
    const std::string bytes(1000, name[0]);
    remote[DigestOf(bytes)] = bytes;
  }
  int fetches = 0;
  ArtifactCache::Fetcher fetch = [&](const std::string& digest, const std::string& path) {
    ++fetches;
    auto it = remote.find(digest);
    if (it == remote.end()) return absl::NotFoundError(digest + " is not stored");
    std::ofstream(path, std::ios::binary) << it->second;
    return absl::OkStatus();
  };
  const std::string a = DigestOf(std::string(1000, 'a'));
  const std::string b = DigestOf(std::string(1000, 'b'));
  const std::string c = DigestOf(std::string(1000, 'c'));
  {
    ArtifactCache cache(dir, /*max_bytes=*/2500, fetch);
    absl::StatusOr<std::string> path_a = cache.Get(a);
    ASSERT_TRUE(path_a.ok()) << path_a.status();
    std::ifstream in(*path_a);
    EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), std::string(1000, 'a'));
    ASSERT_TRUE(cache.Get(a).ok());
    EXPECT_EQ(fetches, 1) << "the second job reads the cached copy";
    EXPECT_EQ(cache.hits(), 1);
    ASSERT_TRUE(cache.Get(b).ok());
    ASSERT_TRUE(cache.Get(a).ok());  // a is now more recent than b
    ASSERT_TRUE(cache.Get(c).ok());  // 3000 > 2500: b goes
    EXPECT_EQ(fetches, 3);
    EXPECT_EQ(cache.bytes(), 2000);
    EXPECT_TRUE(std::filesystem::exists(dir + "/" + a.substr(7)));
    EXPECT_FALSE(std::filesystem::exists(dir + "/" + b.substr(7)));

    absl::StatusOr<std::string> missing = cache.Get(DigestOf("nobody"));
    EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
    EXPECT_THAT(std::string(missing.status().message()),
                ::testing::HasSubstr("cannot fetch " + DigestOf("nobody")));
    EXPECT_EQ(cache.Get("sha256:../../x").status().code(), absl::StatusCode::kInvalidArgument);
  }
  // A restarted worker keeps what it had; a partial fetch is dropped.
  std::ofstream(dir + "/partial.part-1") << "x";
  ArtifactCache again(dir, 2500, fetch);
  EXPECT_EQ(again.bytes(), 2000);
  ASSERT_TRUE(again.Get(c).ok());
  EXPECT_EQ(fetches, 4) << "c came from the kept copy, not a fetch";
  EXPECT_FALSE(std::filesystem::exists(dir + "/partial.part-1"));
}

// A job's code runs as the worker's user and could rewrite a cached file that later jobs read
// (issue 38): a copy changed since it was verified is hashed again before use, kept when its
// bytes still match, and fetched anew when they do not or when a link took its place.
TEST(ArtifactCache, ChangedCopies_VerifiedAgain_TamperedOnesFetchedAnew) {
  const std::string dir = ::testing::TempDir() + "/artifact-cache-seal-" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  const std::string bytes(5000, 'm');
  const std::string digest = DigestOf(bytes);
  int fetches = 0;
  ArtifactCache cache(dir, 0, [&](const std::string& d, const std::string& path) {
    ++fetches;
    std::ofstream(path, std::ios::binary) << bytes;
    return absl::OkStatus();
  });
  absl::StatusOr<std::string> path = cache.Get(digest);
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(std::filesystem::status(*path).permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_read);
  auto contents = [](const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  // Its mode changed and back, bytes untouched: hashed again, still a hit.
  std::filesystem::permissions(*path, std::filesystem::perms::owner_write,
                               std::filesystem::perm_options::add);
  ASSERT_TRUE(cache.Get(digest).ok());
  EXPECT_EQ(fetches, 1);
  EXPECT_EQ(cache.tampered(), 0);
  // Rewritten in place with other bytes of the same size.
  std::filesystem::permissions(*path, std::filesystem::perms::owner_write,
                               std::filesystem::perm_options::add);
  { std::ofstream(*path, std::ios::binary | std::ios::in) << "EVIL"; }
  ASSERT_NE(contents(*path), bytes);
  absl::StatusOr<std::string> again = cache.Get(digest);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(fetches, 2);
  EXPECT_EQ(cache.tampered(), 1);
  EXPECT_EQ(contents(*again), bytes);
  // Replaced by a link to a file of the attacker's.
  const std::string planted = dir + "-planted";
  std::ofstream(planted, std::ios::binary) << std::string(5000, 'x');
  std::filesystem::remove(*again);
  std::filesystem::create_symlink(planted, *again);
  absl::StatusOr<std::string> third = cache.Get(digest);
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(fetches, 3);
  EXPECT_EQ(cache.tampered(), 2);
  EXPECT_FALSE(std::filesystem::is_symlink(*third));
  EXPECT_EQ(contents(*third), bytes);
  EXPECT_EQ(contents(planted), std::string(5000, 'x')) << "the link's target was written";
}

}  // namespace artifact_cache_test
}  // namespace dtrain
