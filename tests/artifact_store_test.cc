// The coordinator's content-addressed store and the SHA-256 it names files by: known digests,
// verified uploads (a corrupted or short transfer never becomes a stored file), one copy per
// content, per-file and total limits with actionable errors, and a reopen that counts what is
// there and drops interrupted uploads.
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/sha256.h"
#include "coordinator/artifacts/artifact_store.h"

namespace dtrain {
namespace artifact_store_test {

using ::testing::HasSubstr;

std::string Dir(const std::string& name) {
  const std::string dir =
      ::testing::TempDir() + "/artifacts-" + std::to_string(getpid()) + "-" + name;
  std::filesystem::remove_all(dir);
  return dir;
}

std::string DigestOf(const std::string& bytes) {
  Sha256 hash;
  hash.Update(bytes);
  return hash.Finish();
}

TEST(Sha256, KnownDigestsWholeAndStreamed) {
  EXPECT_EQ(DigestOf(""),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(DigestOf("abc"),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  Sha256 streamed;
  streamed.Update("a");
  streamed.Update("bc");
  EXPECT_EQ(streamed.Finish(), DigestOf("abc"));
  const std::string path = Dir("file");
  std::ofstream(path, std::ios::binary) << std::string(3 << 20, 'x');
  EXPECT_EQ(*Sha256OfFile(path), DigestOf(std::string(3 << 20, 'x')));
  EXPECT_EQ(Sha256OfFile(path + ".missing").status().code(), absl::StatusCode::kNotFound);

  EXPECT_TRUE(CheckDigest(DigestOf("abc")).ok());
  for (const std::string& bad :
       std::vector<std::string>{"sha256:ABC", "md5:00", "sha256:../../etc/passwd",
                                "sha256:" + std::string(64, 'g'), std::string("")}) {
    EXPECT_EQ(CheckDigest(bad).code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(ArtifactStore, VerifiedUploads_OneCopyPerContent_LimitsAndReopen) {
  const std::string dir = Dir("store");
  auto store = ArtifactStore::Open({dir, /*max_object_bytes=*/1 << 20, /*quota_bytes=*/3 << 20});
  ASSERT_TRUE(store.ok()) << store.status();
  const std::string data(600 << 10, 'd');
  const std::string digest = DigestOf(data);

  // In two chunks, verified at commit.
  auto writer = (*store)->NewWriter(digest, static_cast<int64_t>(data.size()));
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE((*writer)->Append(absl::string_view(data).substr(0, 1000)).ok());
  ASSERT_TRUE((*writer)->Append(absl::string_view(data).substr(1000)).ok());
  ASSERT_TRUE((*writer)->Commit().ok());
  EXPECT_EQ(*(*store)->Size(digest), static_cast<int64_t>(data.size()));
  std::ifstream stored(*(*store)->PathOf(digest), std::ios::binary);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(stored), {}), data);
  EXPECT_EQ((*store)->stored_bytes(), static_cast<int64_t>(data.size()));

  // The same content again: accepted, still one copy.
  auto again = (*store)->NewWriter(digest, static_cast<int64_t>(data.size()));
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE((*again)->Append(data).ok());
  ASSERT_TRUE((*again)->Commit().ok());
  EXPECT_EQ((*store)->stored_bytes(), static_cast<int64_t>(data.size()));

  // Corrupted in transit: DATA_LOSS naming both digests, nothing stored.
  std::string flipped = data;
  flipped[12345] = 'e';
  const std::string other = DigestOf(std::string(1000, 'o'));
  auto corrupt = (*store)->NewWriter(other, static_cast<int64_t>(flipped.size()));
  ASSERT_TRUE(corrupt.ok());
  ASSERT_TRUE((*corrupt)->Append(flipped).ok());
  const absl::Status refused = (*corrupt)->Commit();
  EXPECT_EQ(refused.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(refused.message()), HasSubstr("hash to " + DigestOf(flipped)));
  corrupt->reset();
  EXPECT_EQ((*store)->Size(other).status().code(), absl::StatusCode::kNotFound);

  // Short, and past the announced size.
  const std::string small = "0123456789";
  auto short_writer = (*store)->NewWriter(DigestOf(small), 10);
  ASSERT_TRUE((*short_writer)->Append("01234").ok());
  EXPECT_EQ((*short_writer)->Commit().code(), absl::StatusCode::kDataLoss);
  auto long_writer = (*store)->NewWriter(DigestOf(small), 10);
  EXPECT_EQ((*long_writer)->Append(small + "x").code(), absl::StatusCode::kInvalidArgument);

  // Limits: per file, then the quota (counting uploads in progress).
  auto too_big = (*store)->NewWriter(DigestOf("x"), (1 << 20) + 1);
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(too_big.status().message()), HasSubstr("--max_artifact_bytes"));
  std::vector<std::unique_ptr<ArtifactStore::Writer>> open;
  for (int i = 0; i < 2; ++i) {
    auto w = (*store)->NewWriter(DigestOf(std::to_string(i)), 1 << 20);
    ASSERT_TRUE(w.ok()) << i << " " << w.status();
    open.push_back(std::move(*w));
  }
  auto over = (*store)->NewWriter(DigestOf("over"), 1 << 20);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(over.status().message()), HasSubstr("--artifact_quota_bytes"));
  open.clear();  // abandoned uploads give their reservation back
  EXPECT_TRUE((*store)->NewWriter(DigestOf("over"), 1 << 20).ok());

  EXPECT_EQ((*store)->NewWriter("sha256:nope", 1).status().code(),
            absl::StatusCode::kInvalidArgument);

  // Reopened: the stored bytes are counted again, an interrupted upload is gone.
  std::ofstream(dir + "/incoming/stale") << "partial";
  std::filesystem::last_write_time(
      dir + "/incoming/stale",
      std::filesystem::file_time_type::clock::now() - std::chrono::hours(1));
  store->reset();
  auto reopened = ArtifactStore::Open({dir, 0, 0});
  ASSERT_TRUE(reopened.ok());
  EXPECT_EQ((*reopened)->stored_bytes(), static_cast<int64_t>(data.size()));
  EXPECT_FALSE(std::filesystem::exists(dir + "/incoming/stale"));
  ASSERT_TRUE((*reopened)->Delete(digest).ok());
  EXPECT_EQ((*reopened)->stored_bytes(), 0);
  EXPECT_EQ((*reopened)->Delete(digest).code(), absl::StatusCode::kNotFound);
}

}  // namespace artifact_store_test
}  // namespace dtrain
