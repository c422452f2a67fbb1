// The worker's artifact cache on its own, and how a spec names files (common/file_reference):
// each digest fetched once, the least recently used evicted at the size bound, files kept
// across a restart, malformed digests refused. The fetch here writes known bytes; the real
// fetch from a coordinator is tested end to end (jobs_e2e_test FilesTravelWithTheJob).
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/file_reference.h"
#include "common/sha256.h"
#include "worker/artifact_cache.h"

namespace dtrain {
namespace {

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

}  // namespace
}  // namespace dtrain
