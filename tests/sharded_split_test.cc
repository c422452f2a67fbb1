// A streamed split as the step sees it (worker/data/sharded_split.h): batches by position from
// a pool of decoding threads, the same samples whatever the thread count, exact resume from any
// position (collecting the sample keys), skipped samples counted, a bounded read-ahead, and a
// cancelled wait. Real tar shards on disk; the decoder turns a sample's .cls into a tensor.
#include "worker/data/sharded_split.h"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "tests/test_support.h"
#include "worker/data/dataset.h"

namespace dtrain {
namespace sharded_split_test {

using ::testing::HasSubstr;

// Shards of samples "k<global number>" with a .cls holding that number.
ShardCatalog WriteShards(const std::string& name, const std::vector<int>& sizes) {
  const std::string dir = testing::TestTempPath(name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  ShardCatalog catalog;
  int number = 0;
  for (size_t s = 0; s < sizes.size(); ++s) {
    const std::string path = absl::StrCat(dir, "/part-", s, ".tar");
    struct archive* a = archive_write_new();
    archive_write_set_format_pax_restricted(a);
    archive_write_open_filename(a, path.c_str());
    for (int i = 0; i < sizes[s]; ++i, ++number) {
      const std::string bytes = absl::StrCat(number);
      struct archive_entry* e = archive_entry_new();
      archive_entry_set_pathname(e, absl::StrCat("k", number, ".cls").c_str());
      archive_entry_set_filetype(e, AE_IFREG);
      archive_entry_set_perm(e, 0644);
      archive_entry_set_size(e, static_cast<int64_t>(bytes.size()));
      archive_write_header(a, e);
      archive_write_data(a, bytes.data(), bytes.size());
      archive_entry_free(e);
    }
    archive_write_close(a);
    archive_write_free(a);
    catalog.shards.push_back({path, "", sizes[s]});
    catalog.samples += sizes[s];
  }
  return catalog;
}

absl::StatusOr<std::vector<at::Tensor>> DecodeCls(const ShardSample& sample, int64_t,
                                                  const FieldOutput& = {}) {
  int64_t v = 0;
  if (!absl::SimpleAtoi(sample.fields.at("cls"), &v)) return absl::InvalidArgumentError("cls");
  return std::vector<at::Tensor>{at::scalar_tensor(v, at::kLong)};
}

ShardedSplitOptions Options(const ShardCatalog& catalog, int workers) {
  ShardedSplitOptions o;
  o.name = "train";
  o.catalog = catalog;
  o.training = true;
  o.seed = 11;
  o.shuffle_buffer = 5;
  o.num_workers = workers;
  o.window = 8;
  o.decode = DecodeCls;
  return o;
}

// The numbers of an epoch's batches [from, to) of `batch` positions.
std::vector<int64_t> Read(ShardedSplit& split, int64_t epoch, int64_t from, int64_t to, int batch,
                          absl::Status* status = nullptr) {
  std::vector<int64_t> out;
  for (int64_t p = from; p < to; p += batch) {
    std::vector<int64_t> positions;
    for (int64_t i = p; i < std::min<int64_t>(p + batch, to); ++i) positions.push_back(i);
    absl::StatusOr<c10::IValue> b = split.Batch(epoch, positions);
    if (!b.ok()) {
      if (status != nullptr) *status = b.status();
      return out;
    }
    if (b->isNone()) continue;  // an evaluation batch that lost every sample
    const at::Tensor t = b->toTensor();
    for (int64_t i = 0; i < t.size(0); ++i) out.push_back(t[i].item<int64_t>());
  }
  return out;
}

TEST(ShardedSplit, ThreadsDoNotChangeTheSamplesAndRanksAreDisjoint) {
  const ShardCatalog catalog = WriteShards("threads", {7, 9, 4, 10});  // 30 samples
  std::set<int64_t> seen;
  std::vector<int64_t> rank0_sync;
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<std::vector<int64_t>> by_workers;
    for (int workers : {0, 1, 3}) {
      ShardedSplit split(Options(catalog, workers));
      split.SetRank(rank, 2);
      EXPECT_EQ(split.RankSamples(), 15);
      by_workers.push_back(Read(split, 0, 0, 15, 4));
    }
    EXPECT_EQ(by_workers[0].size(), 15u);
    EXPECT_EQ(by_workers[0], by_workers[1]);
    EXPECT_EQ(by_workers[0], by_workers[2]);
    for (int64_t n : by_workers[0]) EXPECT_TRUE(seen.insert(n).second) << n;
  }
  EXPECT_EQ(seen.size(), 30u);
}

TEST(ShardedSplit, ResumingAtAnyPositionContinuesWithTheSameSamples) {
  const ShardCatalog catalog = WriteShards("resume", {6, 6, 6, 6});
  ShardedSplit whole(Options(catalog, 2));
  whole.SetRank(1, 2);
  const std::vector<int64_t> epoch1 = Read(whole, 1, 0, 12, 3);
  ASSERT_EQ(epoch1.size(), 12u);
  for (int64_t at : {3, 6, 9}) {
    ShardedSplit resumed(Options(catalog, 2));  // a new worker process, after a restart
    resumed.SetRank(1, 2);
    const std::vector<int64_t> rest = Read(resumed, 1, at, 12, 3);
    EXPECT_EQ(rest, std::vector<int64_t>(epoch1.begin() + at, epoch1.end())) << at;
  }
  // A re-sent batch (the coordinator repeats a step after a lost reply) gets the same samples.
  EXPECT_EQ(Read(whole, 1, 3, 6, 3), std::vector<int64_t>(epoch1.begin() + 3, epoch1.begin() + 6));
  // The next epoch is another order of another chunk.
  EXPECT_NE(Read(whole, 2, 0, 12, 3), epoch1);
}

TEST(ShardedSplit, PositionsMustBeConsecutiveAndWithinTheEpoch) {
  const ShardCatalog catalog = WriteShards("positions", {4, 4});
  ShardedSplit split(Options(catalog, 1));
  absl::StatusOr<c10::IValue> gap = split.Batch(0, {0, 2});
  EXPECT_EQ(gap.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(gap.status().message(), HasSubstr("consecutive positions"));
  absl::StatusOr<c10::IValue> beyond = split.Batch(0, {7, 8});
  EXPECT_EQ(beyond.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(beyond.status().message(), HasSubstr("outside split 'train' of 8 samples"));
}

// A batch's buffer is reused for a later batch only once nothing holds it: a batch the step
// still holds, or a view of one, keeps its values while later batches are read.
TEST(ShardedSplit, AHeldBatchIsNeverOverwrittenByTheNext) {
  const ShardCatalog catalog = WriteShards("reuse", {8, 8});
  ShardedSplit split(Options(catalog, 2));
  absl::StatusOr<c10::IValue> first = split.Batch(0, {0, 1, 2, 3});
  ASSERT_TRUE(first.ok()) << first.status();
  const at::Tensor held = first->toTensor();
  const at::Tensor held_copy = held.clone();
  absl::StatusOr<c10::IValue> second = split.Batch(0, {4, 5, 6, 7});
  ASSERT_TRUE(second.ok()) << second.status();
  const at::Tensor view = second->toTensor().slice(0, 1, 3);
  const at::Tensor view_copy = view.clone();
  second = absl::UnknownError("dropped");  // only the view of the second batch remains
  std::vector<at::Tensor> later;
  for (int64_t p = 8; p < 16; p += 4) {
    absl::StatusOr<c10::IValue> b = split.Batch(0, {p, p + 1, p + 2, p + 3});
    ASSERT_TRUE(b.ok()) << b.status();
    later.push_back(b->toTensor().clone());
  }
  EXPECT_TRUE(at::equal(held, held_copy));
  EXPECT_TRUE(at::equal(view, view_copy));
  // Every sample of the epoch once: the buffers' reuse did not change what the batches hold.
  std::set<int64_t> seen;
  for (const at::Tensor& t : {held_copy, view_copy, later[0], later[1]}) {
    for (int64_t i = 0; i < t.size(0); ++i) seen.insert(t[i].item<int64_t>());
  }
  EXPECT_EQ(seen.size(), 14u);  // 4 + 2 (the view) + 8
}

TEST(ShardedSplit, SkippedSamplesAreCountedAndTheBatchShrinks) {
  const ShardCatalog catalog = WriteShards("skip", {5, 5});
  ShardedSplitOptions o = Options(catalog, 2);
  o.shuffle = false;
  o.shuffle_buffer = 0;
  o.decode = [](const ShardSample& s, int64_t e,
                const FieldOutput&) -> absl::StatusOr<std::vector<at::Tensor>> {
    if (s.key == "k3") return absl::InvalidArgumentError("corrupt image");
    return DecodeCls(s, e);
  };
  ShardedSplit failing(o);
  absl::Status status;
  Read(failing, 0, 0, 10, 5, &status);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("sample 'k3': corrupt image"));
  EXPECT_THAT(status.message(), HasSubstr("rank 0, shard '"));

  o.skip_errors = true;
  ShardedSplit skipping(o);
  const std::vector<int64_t> got = Read(skipping, 0, 0, 10, 5);
  EXPECT_EQ(got, (std::vector<int64_t>{0, 1, 2, 4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(skipping.skipped(), 1);
}

// Training with on_error skip: a shard that cannot be read gives its positions to the next
// samples, and the epoch's end is padded from its start, so every batch is whole; a resumed
// stream continues with the same samples; the unreadable samples are counted once.
TEST(ShardedSplit, UnreadableSamplesGiveUpTheirPositionsInTraining) {
  const ShardCatalog catalog = WriteShards("unreadable", {5, 5, 5});
  std::filesystem::remove(catalog.shards[1].location);  // k5..k9
  ShardedSplitOptions o = Options(catalog, 2);
  o.shuffle = false;
  o.shuffle_buffer = 0;
  o.skip_errors = true;
  ShardedSplit split(o);
  const std::vector<int64_t> epoch = Read(split, 0, 0, 15, 5);
  EXPECT_EQ(epoch, (std::vector<int64_t>{0, 1, 2, 3, 4, 10, 11, 12, 13, 14, 0, 1, 2, 3, 4}));
  EXPECT_EQ(split.skipped(), 5);

  ShardedSplit resumed(o);
  EXPECT_EQ(Read(resumed, 0, 5, 15, 5), std::vector<int64_t>(epoch.begin() + 5, epoch.end()));
  EXPECT_EQ(resumed.skipped(), 5);  // the ones after the resumed position only

  // Evaluation keeps each sample's own position: a batch loses what it skips, and is None
  // when it loses all; `kept` says which rows remain.
  o.training = false;
  ShardedSplit eval(o);
  EXPECT_EQ(Read(eval, 0, 0, 15, 5), (std::vector<int64_t>{0, 1, 2, 3, 4, 10, 11, 12, 13, 14}));
  ShardedSplit part(o);
  std::vector<int64_t> kept;
  absl::StatusOr<c10::IValue> b = part.Batch(0, {3, 4, 5, 6, 7, 8, 9, 10, 11}, &kept);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(kept, (std::vector<int64_t>{0, 1, 7, 8}));  // positions 3, 4, 10, 11
  EXPECT_EQ(b->toTensor().size(0), 4);
  EXPECT_EQ(b->toTensor()[2].item<int64_t>(), 10);
  b = part.Batch(0, {12, 13}, &kept);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(kept, (std::vector<int64_t>{0, 1}));
  ShardedSplit none(o);
  b = none.Batch(0, {5, 6, 7}, &kept);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(b->isNone());
  EXPECT_TRUE(kept.empty());
}

TEST(ShardedSplit, NoReadableSampleAtAllIsAnErrorNotALoop) {
  const ShardCatalog catalog = WriteShards("none", {3, 3});
  for (const auto& shard : catalog.shards) std::filesystem::remove(shard.location);
  ShardedSplitOptions o = Options(catalog, 1);
  o.skip_errors = true;
  ShardedSplit split(o);
  absl::StatusOr<c10::IValue> b = split.Batch(0, {0, 1});
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(b.status().message(), HasSubstr("rank 0: no sample of its share of split 'train'"));
  EXPECT_EQ(split.skipped(), 6);
}

// A decoder that writes into the row it is given: the batch holds its values without a copy,
// every sample was offered its row, and a shorter last batch gets rows too.
TEST(ShardedSplit, DecodersWriteIntoTheirBatchRow) {
  const ShardCatalog catalog = WriteShards("rows", {7, 6});
  ShardedSplitOptions o = Options(catalog, 2);
  std::atomic<int> offered{0};
  o.decode = [&](const ShardSample& s, int64_t e,
                 const FieldOutput& output) -> absl::StatusOr<std::vector<at::Tensor>> {
    absl::StatusOr<std::vector<at::Tensor>> cls = DecodeCls(s, e);
    if (!cls.ok()) return cls;
    at::Tensor row = output(0, {2}, at::kLong);
    if (!row.defined()) return absl::InternalError("no row offered");
    offered.fetch_add(1);
    row.fill_((*cls)[0].item<int64_t>());
    return std::vector<at::Tensor>{row};
  };
  ShardedSplit split(o);
  std::set<int64_t> seen;
  for (int64_t p = 0; p < 13; p += 5) {
    std::vector<int64_t> positions;
    for (int64_t i = p; i < std::min<int64_t>(p + 5, 13); ++i) positions.push_back(i);
    absl::StatusOr<c10::IValue> b = split.Batch(0, positions);
    ASSERT_TRUE(b.ok()) << b.status();
    const at::Tensor t = b->toTensor();
    ASSERT_EQ(t.size(0), static_cast<int64_t>(positions.size()));
    ASSERT_EQ(t.size(1), 2);
    for (int64_t i = 0; i < t.size(0); ++i) {
      EXPECT_EQ(t[i][0].item<int64_t>(), t[i][1].item<int64_t>());
      seen.insert(t[i][0].item<int64_t>());
    }
  }
  EXPECT_EQ(seen.size(), 13u);
  EXPECT_EQ(offered.load(), 13);
}

// A rank whose thread may run on one core only (pinned, as deploy/local/cluster.sh pins each
// rank) starts no decoding threads: its reader decodes, into the batch's rows, and the samples,
// a skipped one included, are those of a rank with decoders. Where the thread may use several
// cores, data.num_workers threads decode.
TEST(ShardedSplit, OnOneCoreTheReaderDecodesTheSameSamples) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  ASSERT_EQ(sched_getaffinity(0, sizeof(allowed), &allowed), 0);
  int first_cpu = 0;
  while (!CPU_ISSET(first_cpu, &allowed)) ++first_cpu;
  const ShardCatalog catalog = WriteShards("one_core", {7, 9, 4, 10});  // 30 samples
  struct Run {
    std::vector<int64_t> numbers;
    std::set<std::string> decoded_on;  // thread names
    int decoding_threads = -1;
    int64_t skipped = 0;
    int offered = 0;
  };
  const auto run = [&](bool pinned, bool training, const ShardCatalog& shards) {
    Run r;
    std::mutex mu;
    std::thread step([&] {
      if (pinned) {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(first_cpu, &one);
        ASSERT_EQ(pthread_setaffinity_np(pthread_self(), sizeof(one), &one), 0);
      }
      ShardedSplitOptions o = Options(shards, 2);
      o.skip_errors = true;
      // Evaluation: a batch loses a sample that fails to decode. Training from shards of which
      // one cannot be read: the positions are renumbered (the samples after it take its
      // samples' places, and the epoch's end is padded from its start).
      o.training = training;
      o.decode = [&](const ShardSample& s, int64_t e,
                     const FieldOutput& output) -> absl::StatusOr<std::vector<at::Tensor>> {
        char name[32] = {0};
        pthread_getname_np(pthread_self(), name, sizeof(name));
        std::lock_guard<std::mutex> lock(mu);
        r.decoded_on.insert(name);
        if (s.key == "k12") return absl::InvalidArgumentError("corrupt image");
        absl::StatusOr<std::vector<at::Tensor>> cls = DecodeCls(s, e);
        if (!cls.ok()) return cls;
        at::Tensor row = output(0, {}, at::kLong);
        if (!row.defined()) return cls;
        ++r.offered;
        row.fill_((*cls)[0].item<int64_t>());
        return std::vector<at::Tensor>{row};
      };
      ShardedSplit split(o);
      r.numbers = Read(split, 0, 0, split.RankSamples(), 4);
      r.decoding_threads = split.decoding_threads();
      r.skipped = split.skipped();
    });
    step.join();
    return r;
  };
  const Run one_core = run(true, false, catalog);
  EXPECT_EQ(one_core.decoding_threads, 0);
  EXPECT_EQ(one_core.decoded_on, (std::set<std::string>{"dtrain-read"}));
  EXPECT_EQ(one_core.numbers.size(), 29u);  // 30 samples, k12 skipped
  EXPECT_EQ(std::count(one_core.numbers.begin(), one_core.numbers.end(), 12), 0);
  EXPECT_EQ(one_core.skipped, 1);
  EXPECT_EQ(one_core.offered, 29);  // every row written in place
  if (CPU_COUNT(&allowed) < 2) GTEST_SKIP() << "this machine lets the test use one core only";
  const Run cores = run(false, false, catalog);
  EXPECT_EQ(cores.decoding_threads, 2);
  EXPECT_EQ(cores.decoded_on, (std::set<std::string>{"dtrain-decode"}));
  EXPECT_EQ(cores.numbers, one_core.numbers);
  EXPECT_EQ(cores.skipped, 1);

  ShardCatalog unreadable = WriteShards("one_core_unreadable", {7, 9, 4, 10});
  std::filesystem::remove(unreadable.shards[1].location);  // k7..k15
  const Run one_core_training = run(true, true, unreadable);
  const Run cores_training = run(false, true, unreadable);
  EXPECT_EQ(one_core_training.decoding_threads, 0);
  EXPECT_EQ(one_core_training.numbers.size(), 30u);  // every position kept, the end padded
  EXPECT_EQ(one_core_training.numbers, cores_training.numbers);
  for (int64_t n : one_core_training.numbers) EXPECT_TRUE(n < 7 || n > 15) << n;
  EXPECT_EQ(one_core_training.skipped, 9);
  EXPECT_EQ(cores_training.skipped, 9);
}

// Samples whose tensors cannot stack are named, whether or not they were written in place.
TEST(ShardedSplit, ABatchOfUnequalShapesNamesTheSample) {
  const ShardCatalog catalog = WriteShards("shapes", {6});
  ShardedSplitOptions o = Options(catalog, 2);
  o.shuffle = false;
  o.shuffle_buffer = 0;
  o.decode = [](const ShardSample& s, int64_t,
                const FieldOutput&) -> absl::StatusOr<std::vector<at::Tensor>> {
    return std::vector<at::Tensor>{at::zeros({s.key == "k3" ? 3 : 2})};
  };
  ShardedSplit split(o);
  absl::StatusOr<c10::IValue> b = split.Batch(0, {0, 1, 2, 3, 4, 5});
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(b.status().message(), HasSubstr("sample 'k3' is Float[3]"));
  EXPECT_THAT(b.status().message(), HasSubstr("Float[2]"));
}

TEST(ShardedSplit, ReadAheadStaysWithinTheWindow) {
  const ShardCatalog catalog = WriteShards("window", {50, 50});
  std::atomic<int64_t> decoded{0};
  ShardedSplitOptions o = Options(catalog, 3);
  o.window = 6;
  o.decode = [&](const ShardSample& s, int64_t e, const FieldOutput&) {
    decoded.fetch_add(1);
    return DecodeCls(s, e);
  };
  ShardedSplit split(o);
  Read(split, 0, 0, 2, 2);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // let the pool run ahead
  // Two taken, at most the window's six ahead of them.
  EXPECT_LE(decoded.load(), 2 + 6);
  EXPECT_GE(decoded.load(), 2);
}

// The window is at least prefetch_batches of the batches the step asks for, whose size the
// split learns from the first one: the reader runs that far ahead of what was taken, no
// further.
TEST(ShardedSplit, TheWindowHoldsPrefetchBatchesOfTheStepsBatch) {
  const ShardCatalog catalog = WriteShards("prefetch", {50, 50});
  std::atomic<int64_t> decoded{0};
  ShardedSplitOptions o = Options(catalog, 2);
  o.window = 4;
  o.prefetch_batches = 2;
  o.decode = [&](const ShardSample& s, int64_t e, const FieldOutput&) {
    decoded.fetch_add(1);
    return DecodeCls(s, e);
  };
  ShardedSplit split(o);
  EXPECT_EQ(split.window(), 0);
  EXPECT_EQ(Read(split, 0, 0, 5, 5).size(), 5u);
  EXPECT_EQ(split.window(), 10);
  // Five taken and ten ahead of them.
  for (int i = 0; i < 500 && decoded.load() < 15; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(decoded.load(), 15);

  // An evaluation split reads one batch ahead: an evaluation cut short holds no more.
  o.training = false;
  ShardedSplit eval(o);
  EXPECT_EQ(Read(eval, 0, 0, 5, 5).size(), 5u);
  EXPECT_EQ(eval.window(), 5);
}

// A worker's copy of the job spec has no batch size (the coordinator's setting, cleared before
// the spec reaches workers), yet a streamed split still reads data.prefetch_batches of the
// step's batches ahead, not 2 x num_workers samples.
TEST(ShardedSplit, AWorkersSpecWithoutTheBatchSizeStillPrefetchesWholeBatches) {
  const ShardCatalog catalog = WriteShards("spec_window", {40, 40});
  v1::DataConfig spec;
  spec.mutable_shards()->set_train(absl::StrCat(
      "worker:", std::filesystem::path(catalog.shards[0].location).parent_path().string()));
  v1::ShardField* cls = spec.mutable_shards()->add_fields();
  cls->set_name("cls");
  cls->set_type("int");
  spec.set_num_workers(2);
  spec.set_prefetch_batches(3);
  ASSERT_EQ(spec.batch_size(), 0);
  absl::StatusOr<std::unique_ptr<Dataset>> data = Dataset::Load(spec);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ((*data)->ReadAhead("train"), 0);
  std::vector<int64_t> positions;
  for (int64_t p = 0; p < 16; ++p) positions.push_back(p);
  absl::StatusOr<c10::IValue> batch = (*data)->Batch("train", positions);
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_EQ(batch->toTensor().size(0), 16);
  EXPECT_EQ((*data)->ReadAhead("train"), 48);  // 3 batches of 16
}

// Reads positions [from, to) of `epoch` in batches of `batch` on a thread of its own, so that
// a split that stalls fails the test at 30 s instead of hanging it for the stuck-stream
// deadline.
std::vector<int64_t> ReadWithin30s(ShardedSplit& split, int64_t epoch, int64_t from, int64_t to,
                                   int batch, const std::string& what) {
  absl::Status status;
  std::future<std::vector<int64_t>> read =
      std::async(std::launch::async, [&] { return Read(split, epoch, from, to, batch, &status); });
  if (read.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
    split.Cancel();
    read.wait();
    ADD_FAILURE() << what << ": never came";
    return {};
  }
  EXPECT_TRUE(status.ok()) << what << ": " << status;
  return read.get();
}

// The step waits for a batch as a whole, but the reader stops at a full window and sleeps
// until a quarter of it is free: a batch as large as the window, or larger, must still come,
// whole and in the order the step's own thread decodes, from the epoch's start, from a
// resumed position, with renumbered positions (unreadable samples skipped in training), and
// with no decoding threads. (A wait for all of a batch stalled on the first two.)
TEST(ShardedSplit, ABatchAsLargeAsTheWindowOrLargerStillComes) {
  const ShardCatalog catalog = WriteShards("big-batch", {13, 17, 10, 24});  // 64 samples
  ShardedSplit reference(Options(catalog, 0));
  const std::vector<int64_t> expected = Read(reference, 2, 0, 64, 16);
  ASSERT_EQ(expected.size(), 64u);
  for (auto [window, batch] :
       {std::pair<int64_t, int>{4, 16}, {5, 16}, {15, 16}, {8, 8}, {16, 16}, {32, 8}}) {
    const std::string what = absl::StrCat("window ", window, ", batch ", batch);
    for (int workers : {2, 0}) {
      ShardedSplitOptions o = Options(catalog, workers);
      o.window = window;
      ShardedSplit split(o);
      EXPECT_EQ(ReadWithin30s(split, 2, 0, 64, batch, what), expected) << what;
      ShardedSplit resumed(o);
      EXPECT_EQ(ReadWithin30s(resumed, 2, 16, 64, batch, what + ", resumed at 16"),
                std::vector<int64_t>(expected.begin() + 16, expected.end()))
          << what;
    }
  }

  // Renumbered: the second shard is gone, and training's positions go to the readable samples.
  const ShardCatalog holed = WriteShards("big-batch-holed", {13, 17, 10, 24});
  std::filesystem::remove(holed.shards[1].location);
  ShardedSplitOptions o = Options(holed, 2);
  o.skip_errors = true;
  o.window = 4;
  ShardedSplit unthreaded([&] {
    ShardedSplitOptions u = o;
    u.num_workers = 0;
    return u;
  }());
  const std::vector<int64_t> renumbered = Read(unthreaded, 1, 0, 64, 16);
  ASSERT_EQ(renumbered.size(), 64u);
  ShardedSplit skipping(o);
  EXPECT_EQ(ReadWithin30s(skipping, 1, 0, 64, 16, "renumbered"), renumbered);
  ShardedSplit skipping_resumed(o);
  EXPECT_EQ(ReadWithin30s(skipping_resumed, 1, 16, 64, 16, "renumbered, resumed at 16"),
            std::vector<int64_t>(renumbered.begin() + 16, renumbered.end()));
}

// A download that never answers; it ends when the stream is stopped.
absl::Status NeverAnswers(const std::string&, const std::string&, const std::string&,
                          const std::atomic<bool>* stop, absl::Duration, std::atomic<int64_t>*) {
  while (stop == nullptr || !stop->load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return absl::CancelledError("download stopped");
}

// A resumed stream replays its epoch from the start, reading what it does not hand out: that
// reading is progress, so a replay longer than the stuck-stream bound must not fail as stuck,
// with decoding threads or without, while a stream that reads nothing for that long still
// does. Shards come over "HTTP" at 150 ms each and the bound is 1.5 s (waits poll once a
// second): the replay of 19 shards takes ~3 s, past the second poll, where a stream judged
// only by what it hands out failed.
TEST(ShardedSplit, ALongReplayIsProgress_AStreamThatReadsNothingIsStuck) {
  const ShardCatalog local = WriteShards("replay", std::vector<int>(20, 4));  // 80 samples
  ShardedSplit reference(Options(local, 0));
  const std::vector<int64_t> expected = Read(reference, 0, 0, 80, 4);
  ASSERT_EQ(expected.size(), 80u);
  std::map<std::string, std::string> paths;
  ShardCatalog remote = local;
  for (size_t i = 0; i < remote.shards.size(); ++i) {
    const std::string url = absl::StrCat("https://127.0.0.1:9/part-", i, ".tar");
    paths[url] = remote.shards[i].location;
    remote.shards[i].location = url;
  }
  for (int workers : {2, 0}) {
    ShardedSplitOptions o = Options(remote, workers);
    o.stuck_after = absl::Milliseconds(1500);
    o.fetcher.url = [&paths](const std::string& url, const std::string& dest, const std::string&,
                             const std::atomic<bool>*, absl::Duration, std::atomic<int64_t>*) {
      std::this_thread::sleep_for(std::chrono::milliseconds(150));
      std::filesystem::copy_file(paths.at(url), dest,
                                 std::filesystem::copy_options::overwrite_existing);
      return absl::OkStatus();
    };
    ShardedSplit resumed(o);
    const absl::Time start = absl::Now();
    const std::string what = absl::StrCat("resumed at 76, ", workers, " decoding threads");
    EXPECT_EQ(ReadWithin30s(resumed, 0, 76, 80, 4, what),
              std::vector<int64_t>(expected.begin() + 76, expected.end()))
        << what;
    EXPECT_GT(absl::Now() - start, absl::Seconds(2)) << what << ": too fast to test anything";
  }

  ShardedSplitOptions o = Options(remote, 2);
  o.stuck_after = absl::Milliseconds(400);
  o.fetcher.url = NeverAnswers;
  ShardedSplit stuck(o);
  absl::StatusOr<c10::IValue> b = stuck.Batch(0, {0, 1, 2, 3});
  EXPECT_EQ(b.status().code(), absl::StatusCode::kDeadlineExceeded) << b.status();
  EXPECT_THAT(b.status().message(),
              HasSubstr("read no sample and downloaded less than 1 MiB in 400ms"));
  EXPECT_THAT(b.status().message(), HasSubstr("stuck"));
}

// A download that takes longer than the stuck-stream bound, a mebibyte or more arriving
// within each bound (a large shard over a slow link), is progress: the batch comes once the
// shard is there. A download that trickles (a kilobyte a tenth of a second, each within any
// stall timeout) fails as stuck.
TEST(ShardedSplit, ALongDownloadIsProgress_ATrickleIsStuck) {
  const ShardCatalog local = WriteShards("long_download", {4});
  ShardCatalog remote = local;
  remote.shards[0].location = "https://127.0.0.1:9/part-0.tar";
  for (int64_t tenth : {int64_t{1} << 20, int64_t{1} << 10}) {
    ShardedSplitOptions o = Options(remote, 2);
    o.stuck_after = absl::Milliseconds(400);
    o.fetcher.url = [&local, tenth](const std::string&, const std::string& dest, const std::string&,
                                    const std::atomic<bool>* stop, absl::Duration,
                                    std::atomic<int64_t>* received) {
      // 2.5 s, two of the waits' once-a-second looks past the bound; a trickle goes on until
      // the stream stops it (5 s at most), well past the look that finds it stuck.
      const int tenths = tenth >= (int64_t{1} << 20) ? 25 : 50;
      for (int i = 0; i < tenths; ++i) {
        if (stop != nullptr && stop->load()) return absl::CancelledError("download stopped");
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        if (received != nullptr) received->fetch_add(tenth);
      }
      std::filesystem::copy_file(local.shards[0].location, dest,
                                 std::filesystem::copy_options::overwrite_existing);
      return absl::OkStatus();
    };
    ShardedSplit split(o);
    const absl::Time start = absl::Now();
    absl::StatusOr<c10::IValue> b = split.Batch(0, {0, 1, 2, 3});
    if (tenth >= (int64_t{1} << 20)) {
      ASSERT_TRUE(b.ok()) << b.status();
      EXPECT_EQ(b->toTensor().sum().item<int64_t>(), 0 + 1 + 2 + 3);
      EXPECT_GT(absl::Now() - start, absl::Seconds(2)) << "too fast to test anything";
    } else {
      EXPECT_EQ(b.status().code(), absl::StatusCode::kDeadlineExceeded) << b.status();
      EXPECT_THAT(b.status().message(), HasSubstr("downloaded less than 1 MiB"));
    }
  }
}

TEST(ShardedSplit, ACancelledJobStopsAWaitForAStuckShard) {
  const ShardCatalog catalog = WriteShards("stuck", {4});
  ShardedSplitOptions o = Options(catalog, 1);
  std::atomic<bool> cancelled{false};
  o.cancelled = &cancelled;
  o.catalog.shards[0].location = "https://127.0.0.1:9/never.tar";
  o.fetcher.url = NeverAnswers;
  ShardedSplit split(o);
  std::thread canceller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    cancelled.store(true);
  });
  const absl::Time start = absl::Now();
  absl::StatusOr<c10::IValue> b = split.Batch(0, {0});
  canceller.join();
  EXPECT_EQ(b.status().code(), absl::StatusCode::kCancelled);
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
}

// The reader wakes the decoders for several small samples at once; samples it read before it
// blocked (a slow shard) still reach the step, whether they were queued before the step began
// to wait or while it waits. The shard is a FIFO fed in two parts that stays open: a sample is
// complete once the next member's header is read, so members 0-1 give sample 0, and members
// 2-3 samples 1 and 2, queued while the step is away (it waits for them only after a pause).
TEST(ShardedSplit, SamplesReadBeforeTheShardStallsReachTheStep) {
  const ShardCatalog source = WriteShards("stall_source", {4});
  std::string bytes;
  {
    std::ifstream in(source.shards[0].location, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  // Four 512-byte headers, each with one 512-byte block of data, then the archive's end.
  ASSERT_GT(bytes.size(), 4096u);
  ASSERT_NE(bytes[3 * 1024], '\0') << "the fourth member's header is not where expected";
  ASSERT_EQ(bytes.find_first_not_of('\0', 4096), std::string::npos) << "more than 4 members";
  const std::string fifo = testing::TestTempPath("stall.tar");
  std::filesystem::remove(fifo);
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);

  std::promise<void> second_part;
  std::promise<void> release;
  std::thread writer([&, more = second_part.get_future(), done = release.get_future()] {
    // A reader that closes early must fail the test, not kill the binary with SIGPIPE.
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
    const int fd = open(fifo.c_str(), O_WRONLY);  // until the reader opens it
    if (fd < 0) return;
    auto send = [&](size_t from, size_t to) {
      while (from < to) {
        const ssize_t n = write(fd, bytes.data() + from, to - from);
        if (n <= 0) return;
        from += static_cast<size_t>(n);
      }
    };
    send(0, 2048);
    more.wait();
    send(2048, 4096);
    done.wait();
    close(fd);  // the reader sees a truncated archive, and ends
  });

  ShardCatalog catalog;
  catalog.shards.push_back({fifo, "", 20});
  catalog.samples = 20;
  ShardedSplitOptions o = Options(catalog, 2);
  o.shuffle = false;
  o.shuffle_buffer = 0;
  o.window = 64;
  o.stuck_after = absl::Seconds(20);  // a broken wake-up fails in seconds, not minutes
  std::vector<int64_t> first;
  std::vector<int64_t> rest;
  {
    ShardedSplit split(o);
    std::vector<int64_t>* into = &first;
    std::future<std::vector<int64_t>> batch =
        std::async(std::launch::async, [&] { return Read(split, 0, 0, 1, 1); });
    const bool came = batch.wait_for(std::chrono::seconds(5)) == std::future_status::ready;
    EXPECT_TRUE(came) << "the batch of sample 0 waited for more of the shard than it needs";
    if (came) {
      first = batch.get();
      second_part.set_value();
      std::this_thread::sleep_for(std::chrono::milliseconds(300));  // samples 1-2 are queued
      into = &rest;
      batch = std::async(std::launch::async, [&] { return Read(split, 0, 1, 3, 2); });
      EXPECT_EQ(batch.wait_for(std::chrono::seconds(5)), std::future_status::ready)
          << "the batch of samples 1-2 waited for more of the shard than it needs";
    } else {
      second_part.set_value();
    }
    release.set_value();  // before anything can fail: the split's threads must see an end
    *into = batch.get();
    // Should the stream never have opened the FIFO, the writer's open would wait forever.
    const int unblock = open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
    writer.join();
    if (unblock >= 0) close(unblock);
  }
  EXPECT_EQ(first, (std::vector<int64_t>{0}));
  EXPECT_EQ(rest, (std::vector<int64_t>{1, 2}));
}

}  // namespace sharded_split_test
}  // namespace dtrain
