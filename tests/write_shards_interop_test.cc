// Shards written by Python's dtrain.data.write_shards (python/dtrain/data.py) read by the
// worker's TarShardReader: the two sides agree on keys, field names and bytes, including a key
// long enough to need a pax header. Runs Debian's python3 with the package the build made.
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "tests/test_support.h"
#include "worker/data/tar_shard_reader.h"

namespace dtrain {
namespace write_shards_interop_test {

using ::testing::ElementsAre;

// Seven samples, three per shard: an int32 array (.npy), a class (.cls), text (.txt) and raw
// bytes; sample 3's key is 200 characters, over ustar's 100 for a name.
constexpr char kWriter[] = R"(
import sys, numpy
from dtrain.data import write_shards
samples = [{"__key__": "k" * 200 if i == 3 else f"s{i}", "x": numpy.arange(i + 1, dtype="<i4"),
            "cls": i, "caption": f"sample {i}", "raw.bin": bytes([i, 0, 255])} for i in range(7)]
write_shards(samples, sys.argv[1], samples_per_shard=3)
)";

std::vector<ShardSample> ReadShard(const std::string& path) {
  std::vector<ShardSample> samples;
  absl::StatusOr<std::unique_ptr<TarShardReader>> reader = TarShardReader::Open(path);
  EXPECT_TRUE(reader.ok()) << reader.status();
  if (!reader.ok()) return samples;
  while (true) {
    absl::StatusOr<std::optional<ShardSample>> sample = (*reader)->Next();
    EXPECT_TRUE(sample.ok()) << sample.status();
    if (!sample.ok() || !sample->has_value()) break;
    samples.push_back(**sample);
  }
  return samples;
}

TEST(WriteShardsInterop, PythonShards_ReadByTarShardReader_SameSamples) {
  const std::string dir = testing::TestTempPath("shards");
  const std::string script = testing::TestTempPath("write.py");
  std::ofstream(script) << kWriter;
  testing::CommandResult run = testing::RunShell(
      absl::StrCat("PYTHONPATH=" DTRAIN_PYTHON_ROOT " /usr/bin/python3 ", script, " ", dir));
  ASSERT_EQ(run.exit_code, 0) << run.output;

  std::vector<ShardSample> samples;
  std::vector<size_t> counts;
  for (const char* name : {"shard-000000.tar", "shard-000001.tar", "shard-000002.tar"}) {
    std::vector<ShardSample> shard = ReadShard(absl::StrCat(dir, "/", name));
    counts.push_back(shard.size());
    samples.insert(samples.end(), shard.begin(), shard.end());
  }
  EXPECT_THAT(counts, ElementsAre(3, 3, 1));
  ASSERT_EQ(samples.size(), 7u);
  for (int i = 0; i < 7; ++i) {
    const ShardSample& s = samples[i];
    EXPECT_EQ(s.key, i == 3 ? std::string(200, 'k') : absl::StrCat("s", i));
    ASSERT_EQ(s.fields.size(), 4u) << s.key;
    EXPECT_EQ(s.fields.at("cls"), std::to_string(i));
    EXPECT_EQ(s.fields.at("caption.txt"), absl::StrCat("sample ", i));
    EXPECT_EQ(s.fields.at("raw.bin"), std::string({static_cast<char>(i), '\0', '\xff'}));
    // numpy's format: magic, version, header; the data is i+1 little-endian int32s at the end.
    const std::string& npy = s.fields.at("x.npy");
    ASSERT_GT(npy.size(), 4u * (i + 1));
    EXPECT_EQ(npy.substr(0, 6), "\x93NUMPY");
    EXPECT_NE(npy.find("'descr': '<i4'"), std::string::npos) << npy;
    const char* data = npy.data() + npy.size() - 4 * (i + 1);
    for (int j = 0; j <= i; ++j) {
      int32_t value = 0;
      std::memcpy(&value, data + 4 * j, 4);  // x86 and arm64 are little-endian
      EXPECT_EQ(value, j);
    }
  }
}

}  // namespace write_shards_interop_test
}  // namespace dtrain
