// WebDataset shards read with libarchive (worker/data/tar_shard_reader.h): samples grouped by
// key as plain `tar` writes them, and the hostile members a shard must not get through.
#include "worker/data/tar_shard_reader.h"

#include <archive.h>
#include <archive_entry.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/test_support.h"

namespace dtrain {
namespace tar_shard_reader_test {

using ::testing::HasSubstr;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

struct Member {
  std::string name;
  std::string bytes;
  mode_t type = AE_IFREG;
  int64_t claimed_size = -1;  // a header that claims another size than the bytes written
};

// A shard written with libarchive's own writer, so the test can make what `tar` would refuse.
std::string WriteShard(const std::string& name, const std::vector<Member>& members) {
  const std::string path = testing::TestTempPath(name);
  struct archive* a = archive_write_new();
  archive_write_set_format_pax_restricted(a);
  EXPECT_EQ(archive_write_open_filename(a, path.c_str()), ARCHIVE_OK);
  for (const Member& m : members) {
    struct archive_entry* e = archive_entry_new();
    archive_entry_set_pathname(e, m.name.c_str());
    archive_entry_set_filetype(e, m.type);
    archive_entry_set_perm(e, 0644);
    if (m.type == AE_IFLNK) archive_entry_set_symlink(e, "/etc/passwd");
    archive_entry_set_size(
        e, m.claimed_size >= 0 ? m.claimed_size : static_cast<int64_t>(m.bytes.size()));
    archive_write_header(a, e);
    if (!m.bytes.empty()) archive_write_data(a, m.bytes.data(), m.bytes.size());
    archive_entry_free(e);
  }
  archive_write_close(a);
  archive_write_free(a);
  return path;
}

std::vector<ShardSample> ReadAll(const std::string& path, absl::Status* status,
                                 TarShardLimits limits = {}) {
  std::vector<ShardSample> samples;
  absl::StatusOr<std::unique_ptr<TarShardReader>> reader = TarShardReader::Open(path, limits);
  if (!reader.ok()) {
    *status = reader.status();
    return samples;
  }
  while (true) {
    absl::StatusOr<std::optional<ShardSample>> next = (*reader)->Next();
    if (!next.ok()) {
      *status = next.status();
      return samples;
    }
    if (!next->has_value()) break;
    samples.push_back(**next);
  }
  *status = absl::OkStatus();
  return samples;
}

TEST(TarShard, PlainTarOfADirectory_SamplesByKeyFieldsByExtension) {
  // As a user makes a shard without webdataset: files sharing a basename, then `tar`.
  const std::string dir = testing::TestTempPath("src");
  std::filesystem::create_directories(dir + "/train");
  std::ofstream(dir + "/train/a0001.cls") << "3";
  std::ofstream(dir + "/train/a0001.JPG") << "jpeg-bytes";
  std::ofstream(dir + "/train/a0002.cls") << "7";
  std::ofstream(dir + "/train/a0002.seg.png") << "png";
  const std::string shard = testing::TestTempPath("plain.tar");
  testing::CommandResult tar = testing::RunShell("tar -C " + dir + " -cf " + shard +
                                                 " train/a0001.cls train/a0001.JPG train/a0002.cls"
                                                 " train/a0002.seg.png");
  ASSERT_EQ(tar.exit_code, 0) << tar.output;
  absl::Status status;
  std::vector<ShardSample> samples = ReadAll(shard, &status);
  ASSERT_TRUE(status.ok()) << status;
  ASSERT_EQ(samples.size(), 2u);
  EXPECT_EQ(samples[0].key, "train/a0001");
  EXPECT_THAT(samples[0].fields, UnorderedElementsAre(Pair("cls", "3"), Pair("jpg", "jpeg-bytes")));
  EXPECT_EQ(samples[1].key, "train/a0002");
  EXPECT_THAT(samples[1].fields, UnorderedElementsAre(Pair("cls", "7"), Pair("seg.png", "png")));
  // gzip-compressed shards too (.tar.gz / .tgz).
  ASSERT_EQ(testing::RunShell("gzip -kf " + shard).exit_code, 0);
  std::vector<ShardSample> again = ReadAll(shard + ".gz", &status);
  ASSERT_TRUE(status.ok()) << status;
  ASSERT_EQ(again.size(), 2u);
  EXPECT_EQ(again[1].fields.at("seg.png"), "png");
}

TEST(TarShard, MemberNames_SplitAsWebDatasetDoes) {
  EXPECT_EQ(SplitMemberName("dir.v2/x.y.JPG"),
            std::make_pair(std::string("dir.v2/x"), std::string("y.jpg")));
  EXPECT_EQ(SplitMemberName("noext"), std::nullopt);
  EXPECT_EQ(SplitMemberName("d/.hidden"), std::nullopt);
  EXPECT_EQ(SplitMemberName("d/trailing."), std::nullopt);
}

TEST(TarShard, HostileMembers_RefusedNamingTheShardAndMember) {
  struct Case {
    std::string name;
    std::vector<Member> members;
    absl::StatusCode code;
    std::string want;
  } cases[] = {
      {"link.tar",
       {{"a.cls", "1"}, {"a.jpg", "", AE_IFLNK}},
       absl::StatusCode::kInvalidArgument,
       "member 'a.jpg' is not a regular file"},
      {"noext.tar",
       {{"README", "x"}},
       absl::StatusCode::kInvalidArgument,
       "member 'README' has no extension"},
      {"twice.tar",
       {{"a.cls", "1"}, {"a.CLS", "2"}},
       absl::StatusCode::kInvalidArgument,
       "sample 'a' has field 'cls' twice"},
      {"big.tar",
       {{"a.bin", std::string(2000, 'x')}},
       absl::StatusCode::kInvalidArgument,
       "member 'a.bin' is 2000 bytes; at most 1000"},
  };
  TarShardLimits limits;
  limits.max_member_bytes = 1000;
  for (const Case& c : cases) {
    absl::Status status;
    ReadAll(WriteShard(c.name, c.members), &status, limits);
    EXPECT_EQ(status.code(), c.code) << c.name << ": " << status;
    EXPECT_THAT(status.message(), HasSubstr(c.want)) << c.name;
    EXPECT_THAT(status.message(), HasSubstr(c.name)) << c.name;
  }
}

TEST(TarShard, SampleLimits_CountEveryField) {
  TarShardLimits limits;
  limits.max_sample_bytes = 100;
  absl::Status status;
  ReadAll(WriteShard("fat.tar", {{"a.x", std::string(60, 'x')}, {"a.y", std::string(60, 'y')}}),
          &status, limits);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("sample 'a' is over 100 bytes"));
}

TEST(TarShard, TruncatedOrNotATar_DataLossNamingTheShard) {
  const std::string whole =
      WriteShard("whole.tar", {{"a.cls", "1"}, {"b.bin", std::string(5000, 'b')}});
  const std::string cut = testing::TestTempPath("cut.tar");
  std::filesystem::copy_file(whole, cut);
  std::filesystem::resize_file(cut, 512 * 3 + 1000);  // inside b.bin's data
  absl::Status status;
  std::vector<ShardSample> samples = ReadAll(cut, &status);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(), HasSubstr("cut.tar"));
  EXPECT_THAT(status.message(), HasSubstr("member 'b.bin' ends after "));
  EXPECT_THAT(status.message(), HasSubstr(" of 5000 bytes"));
  const std::string junk = testing::TestTempPath("junk.tar");
  std::ofstream(junk) << std::string(3000, '\x7f');
  ReadAll(junk, &status);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(), HasSubstr("junk.tar"));
  ReadAll(testing::TestTempPath("missing.tar"), &status);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
}

// GNU tar's sparse members: their holes read as zeros, inside and at the end, as
// archive_read_data would give them.
TEST(TarShard, SparseMembers_HolesReadAsZeros) {
  const std::string dir = testing::TestTempPath("sparse");
  std::filesystem::create_directories(dir);
  std::string inner(300000, '\0');
  inner.replace(0, 5, "first");
  inner.replace(inner.size() - 4, 4, "last");
  std::string trailing(200000, '\0');
  trailing.replace(0, 4, "head");
  for (const auto& [name, bytes] : {std::pair<std::string, std::string>{"a.bin", inner},
                                    std::pair<std::string, std::string>{"b.bin", trailing}}) {
    std::ofstream out(dir + "/" + name, std::ios::binary);
    // Seeking over the zeros leaves holes in the file, which tar --sparse records as such.
    out.write(bytes.data(), 8);
    out.seekp(static_cast<std::streamoff>(bytes.find_last_not_of('\0') / 8 * 8));
    out.write(bytes.data() + bytes.find_last_not_of('\0') / 8 * 8,
              static_cast<std::streamsize>(bytes.find_last_not_of('\0') % 8 + 1));
  }
  std::filesystem::resize_file(dir + "/b.bin", trailing.size());
  const std::string shard = dir + "/sparse.tar";
  testing::CommandResult tar =
      testing::RunShell("cd " + dir + " && tar --sparse -cf " + shard + " a.bin b.bin 2>&1");
  ASSERT_EQ(tar.exit_code, 0) << tar.output;
  // Stored sparse (a map of the data, not 500 KB of zeros), or this tests nothing new.
  EXPECT_LT(std::filesystem::file_size(shard), 100u * 1024);
  absl::Status status;
  std::vector<ShardSample> samples = ReadAll(shard, &status);
  ASSERT_TRUE(status.ok()) << status;
  ASSERT_EQ(samples.size(), 2u);
  EXPECT_EQ(samples[0].key, "a");
  EXPECT_TRUE(samples[0].fields.at("bin") == inner);
  EXPECT_EQ(samples[1].key, "b");
  EXPECT_TRUE(samples[1].fields.at("bin") == trailing);
}

}  // namespace tar_shard_reader_test
}  // namespace dtrain
