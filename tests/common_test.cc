// Unit tests of common/: dtype facts, tensor validation, half conversions, status mapping, the
// allocator settings as glibc reads them, a thread's scheduler statistics, doubles as int64.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/atomic_file.h"
#include "common/directories.h"
#include "common/dtype.h"
#include "common/grpc_status.h"
#include "common/half.h"
#include "common/int_of_double.h"
#include "common/packed_batch_results.h"
#include "common/process_tuning.h"
#include "common/tensor.h"
#include "common/tensor_frames.h"
#include "common/thread_schedstat.h"
#include "common/yaml_float.h"
#include "google/protobuf/util/message_differencer.h"

namespace dtrain {
namespace common_test {

v1::TensorMeta Meta(v1::DType dtype, std::vector<int64_t> shape) {
  v1::TensorMeta m;
  m.set_dtype(dtype);
  for (int64_t d : shape) m.add_shape(d);
  return m;
}

TEST(DType, SizesAndNames_RoundTrip) {
  EXPECT_EQ(DTypeSize(v1::DTYPE_FLOAT64).value(), 8);
  EXPECT_EQ(DTypeSize(v1::DTYPE_BFLOAT16).value(), 2);
  EXPECT_EQ(DTypeSize(v1::DTYPE_BOOL).value(), 1);
  EXPECT_FALSE(DTypeSize(v1::DTYPE_UNSPECIFIED).ok());
  EXPECT_EQ(ParseDType("half").value(), v1::DTYPE_FLOAT16);
  EXPECT_EQ(ParseDType(DTypeName(v1::DTYPE_INT8)).value(), v1::DTYPE_INT8);
  EXPECT_FALSE(ParseDType("complex64").ok());
}

TEST(TensorMeta, Validation_ReturnsBytesOrPreciseError) {
  EXPECT_EQ(ValidateMeta(Meta(v1::DTYPE_FLOAT32, {2, 3})).value(), 24);
  EXPECT_EQ(ValidateMeta(Meta(v1::DTYPE_INT64, {})).value(), 8);  // scalar
  EXPECT_EQ(ValidateMeta(Meta(v1::DTYPE_INT64, {0, 1 << 30})).value(), 0);
  auto negative = ValidateMeta(Meta(v1::DTYPE_FLOAT32, {2, -1}));
  EXPECT_EQ(negative.status().code(), absl::StatusCode::kInvalidArgument);
  auto overflow = ValidateMeta(Meta(v1::DTYPE_FLOAT64, {int64_t{1} << 31, int64_t{1} << 31}));
  EXPECT_EQ(overflow.status().code(), absl::StatusCode::kInvalidArgument);
  auto too_big = ValidateMeta(Meta(v1::DTYPE_UINT8, {100}), /*max_bytes=*/99);
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidatePayload(Meta(v1::DTYPE_INT32, {3}), 11).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ValidatePayload(Meta(v1::DTYPE_INT32, {3}), 12).ok());
  EXPECT_EQ(DescribeMeta(Meta(v1::DTYPE_BFLOAT16, {4, 5})), "bfloat16[4, 5]");
}

TEST(TensorProto, RoundTrip_AndRejectsShortData) {
  HostTensor t = HostTensor::FromVector<int32_t>(v1::DTYPE_INT32, {2}, {7, -9});
  v1::Tensor proto;
  ToProto(t, &proto);
  EXPECT_EQ(FromProto(proto).value(), t);
  proto.mutable_data()->pop_back();
  EXPECT_EQ(FromProto(proto).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Half, KnownBitPatterns) {
  EXPECT_EQ(FloatToHalf(1.0f), 0x3C00);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7BFF);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xC000);
  EXPECT_EQ(HalfToFloat(0x3555), 0.333251953125f);
  EXPECT_EQ(FloatToHalf(1e6f), 0x7C00);  // overflow to infinity
  EXPECT_EQ(FloatToBFloat16(1.0f), 0x3F80);
  EXPECT_EQ(BFloat16ToFloat(0xC040), -3.0f);
  // 1 + 2^-8 lies exactly between two bfloat16 values: ties go to even (1.0).
  EXPECT_EQ(FloatToBFloat16(1.00390625f), 0x3F80);
  // 1 + 3 * 2^-8 lies between 1+2^-7 (odd) and 1+2^-6 (even): rounds up to even.
  EXPECT_EQ(FloatToBFloat16(1.01171875f), 0x3F82);
  EXPECT_TRUE(
      std::isnan(BFloat16ToFloat(FloatToBFloat16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(GrpcStatus, ConversionKeepsCodeAndMessage) {
  absl::Status s = absl::DeadlineExceededError("rank 3 missing");
  grpc::Status g = ToGrpcStatus(s);
  EXPECT_EQ(g.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(g.error_message(), "rank 3 missing");
  EXPECT_EQ(FromGrpcStatus(g), s);
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
}

// glibc refuses some values (mallopt returns 0, and the setting silently stays at its default):
// each must be taken, and the point of the mmap threshold must hold, a 64 MiB block (a large
// collective's payload) coming from the heap rather than from a fresh mmap. In a child, so that
// this test process keeps its own allocator settings.
TEST(ProcessTuning, EverySettingIsTaken_LargeBlocksStayOnTheHeap) {
  EXPECT_EXIT(
      {
        for (const MallocSetting& setting : kMallocSettings) {
          if (mallopt(setting.parameter, setting.value) != 1) {
            std::fprintf(stderr, "refused: %s\n", setting.name);
            std::_Exit(1);
          }
        }
        const size_t mapped_before = mallinfo2().hblkhd;
        void* block = std::malloc(size_t{64} << 20);
        const size_t mapped_after = mallinfo2().hblkhd;
        std::fprintf(stderr, "mapped %zu -> %zu\n", mapped_before, mapped_after);
        std::free(block);
        std::_Exit(block != nullptr && mapped_after == mapped_before ? 0 : 2);
      },
      testing::ExitedWithCode(0), "mapped");
}

// A training call's answers packed (LocalResult.packed): scalars and learning rates only, the
// same names in every batch (rates: in every batch that stepped), consecutive batch_idx;
// anything else stays a BatchResult per batch.
v1::LocalResult PlainResult(int n) {
  v1::LocalResult r;
  for (int i = 0; i < n; ++i) {
    v1::BatchResult* b = r.add_batches();
    b->set_batch_idx(10 + i);
    b->set_size(64 - i);
    (*b->mutable_scalars())["loss"] = 0.5 + i;
    (*b->mutable_scalars())["acc"] = 0.25 * i;
    b->set_optimizer_stepped(i % 2 == 1);
    b->set_step_skipped(i == 2);
    if (b->optimizer_stepped()) {
      (*b->mutable_learning_rates())["lr-SGD/pg2"] = 0.01 * i;
      (*b->mutable_learning_rates())["lr-SGD/pg1"] = 0.1 * i;
    }
  }
  return r;
}

TEST(PackedBatchResults, ScalarsOnly_PackedInOrder_NamesSorted) {
  v1::LocalResult r = PlainResult(3);
  ASSERT_TRUE(PackBatchResults(&r));
  EXPECT_EQ(r.batches_size(), 0);
  const v1::PackedBatchResults& p = r.packed();
  EXPECT_EQ(p.first_batch_idx(), 10);
  EXPECT_EQ(std::vector<int64_t>(p.sizes().begin(), p.sizes().end()),
            (std::vector<int64_t>{64, 63, 62}));
  EXPECT_EQ(std::vector<std::string>(p.scalar_names().begin(), p.scalar_names().end()),
            (std::vector<std::string>{"acc", "loss"}));
  EXPECT_EQ(std::vector<double>(p.scalar_values().begin(), p.scalar_values().end()),
            (std::vector<double>{0, 0.5, 0.25, 1.5, 0.5, 2.5}));
  EXPECT_EQ(std::vector<bool>(p.optimizer_stepped().begin(), p.optimizer_stepped().end()),
            (std::vector<bool>{false, true, false}));
  EXPECT_EQ(std::vector<bool>(p.step_skipped().begin(), p.step_skipped().end()),
            (std::vector<bool>{false, false, true}));
  // Only batch 1 stepped: one row of rates.
  EXPECT_EQ(std::vector<std::string>(p.rate_names().begin(), p.rate_names().end()),
            (std::vector<std::string>{"lr-SGD/pg1", "lr-SGD/pg2"}));
  EXPECT_EQ(std::vector<double>(p.rate_values().begin(), p.rate_values().end()),
            (std::vector<double>{0.1, 0.01}));
  EXPECT_TRUE(CheckPackedBatchResults(r, 10, 3).ok());
}

TEST(PackedBatchResults, EachBatchReadBackInPlace_AsItWasPacked) {
  const v1::LocalResult original = PlainResult(5);  // batches 1 and 3 stepped
  v1::LocalResult r = original;
  ASSERT_TRUE(PackBatchResults(&r));
  ASSERT_TRUE(CheckPackedBatchResults(r, 10, 5).ok());
  const v1::PackedBatchResults& p = r.packed();  // names sorted: acc, loss; pg1, pg2
  int b = 0;
  ForEachPackedBatch(p, [&](const PackedBatch& batch) {
    const v1::BatchResult& want = original.batches(b);
    EXPECT_EQ(batch.size, want.size()) << b;
    EXPECT_EQ(batch.optimizer_stepped, want.optimizer_stepped()) << b;
    EXPECT_EQ(batch.step_skipped, want.step_skipped()) << b;
    ASSERT_NE(batch.scalars, nullptr);
    EXPECT_EQ(batch.scalars[0], want.scalars().at("acc")) << b;
    EXPECT_EQ(batch.scalars[1], want.scalars().at("loss")) << b;
    if (want.optimizer_stepped()) {
      ASSERT_NE(batch.rates, nullptr) << b;
      EXPECT_EQ(batch.rates[0], want.learning_rates().at("lr-SGD/pg1")) << b;
      EXPECT_EQ(batch.rates[1], want.learning_rates().at("lr-SGD/pg2")) << b;
    } else {
      EXPECT_EQ(batch.rates, nullptr) << b;
    }
    ++b;
  });
  EXPECT_EQ(b, 5);
  // Without scalar names a batch has no values to point at.
  v1::PackedBatchResults bare = p;
  bare.clear_scalar_names();
  bare.clear_scalar_values();
  int seen = 0;
  ForEachPackedBatch(bare, [&](const PackedBatch& batch) {
    EXPECT_EQ(batch.scalars, nullptr);
    ++seen;
  });
  EXPECT_EQ(seen, 5);
}

TEST(PackedBatchResults, AnythingButScalars_LeftAsBatchResults) {
  const std::vector<std::pair<const char*, std::function<void(v1::BatchResult*)>>> edits = {
      {"logged", [](v1::BatchResult* b) { (*b->mutable_logged())["x"].set_value(1); }},
      {"another learning rate",
       [](v1::BatchResult* b) { (*b->mutable_learning_rates())["x"] = 1; }},
      {"a tensor", [](v1::BatchResult* b) { (*b->mutable_tensors())["out"]; }},
      {"kept rows", [](v1::BatchResult* b) { b->add_kept_rows(0); }},
      {"another scalar name",
       [](v1::BatchResult* b) {
         b->mutable_scalars()->erase("acc");
         (*b->mutable_scalars())["grad_norm"] = 1;
       }},
      {"one scalar more", [](v1::BatchResult* b) { (*b->mutable_scalars())["grad_norm"] = 1; }},
      {"a gap in batch_idx", [](v1::BatchResult* b) { b->set_batch_idx(99); }},
      {"a rate without a step", [](v1::BatchResult* b) { b->set_optimizer_stepped(false); }},
  };
  for (const auto& [what, edit] : edits) {
    v1::LocalResult r = PlainResult(4);  // batches 1 and 3 stepped
    edit(r.mutable_batches(1));
    const v1::LocalResult before = r;
    EXPECT_FALSE(PackBatchResults(&r)) << what;
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(r, before)) << what;
  }
  v1::LocalResult empty;
  EXPECT_FALSE(PackBatchResults(&empty));
}

TEST(PackedBatchResults, MisshapenAnswer_RefusedSayingWhatIsOff) {
  v1::LocalResult r = PlainResult(4);  // batches 10 to 13
  ASSERT_TRUE(PackBatchResults(&r));
  ASSERT_TRUE(CheckPackedBatchResults(r, 10, 4).ok());
  auto refused = [](const v1::LocalResult& answer, int64_t first, int64_t count,
                    const std::string& says) {
    const absl::Status s = CheckPackedBatchResults(answer, first, count);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << says;
    EXPECT_NE(s.message().find(says), std::string::npos) << s;
  };
  v1::LocalResult short_values = r;
  short_values.mutable_packed()->mutable_scalar_values()->RemoveLast();
  refused(short_values, 10, 4, "carry 7 values (want 8)");
  v1::LocalResult flags = r;
  flags.mutable_packed()->add_optimizer_stepped(true);
  refused(flags, 10, 4, "5 optimizer_stepped");
  v1::LocalResult rates = r;  // batches 1 and 3 stepped: 2 rows of 2
  rates.mutable_packed()->add_rate_values(0.5);
  refused(rates, 10, 4, "carry 5 rate values (want 4)");
  refused(r, 10, 3, "hold 4 batches; the call sent 3");
  // Another call's answer, or one that is both packed and listed, is not read at all.
  refused(r, 11, 4, "start at batch 10; the call started at 11");
  v1::LocalResult both = r;
  *both.add_batches() = PlainResult(1).batches(0);
  refused(both, 10, 4, "come with 1 BatchResults too");
}

// A stream's payload bound (common/tensor_frames.h), which both ends apply to a peer's chunks.
TEST(PayloadCursor, HandsOutRoomInOrder_RefusesWhatPassesTheHeader_TakesNothingThen) {
  PayloadCursor cursor;
  cursor.Expect(10);
  EXPECT_EQ(*cursor.Advance(4), 0u);
  EXPECT_EQ(*cursor.Advance(0), 4u);
  const absl::StatusOr<uint64_t> over = cursor.Advance(7);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(over.status().message(),
            "the stream carries 7 more payload bytes after 4 of the 10 its header announced");
  EXPECT_EQ(cursor.received(), 4u);
  EXPECT_FALSE(cursor.Advance(-1).ok());
  EXPECT_EQ(*cursor.Advance(6), 4u);
  EXPECT_EQ(cursor.received(), 10u);
  EXPECT_FALSE(cursor.Advance(1).ok());
  EXPECT_EQ(*cursor.Advance(0), 10u);
}

TEST(IntOfDouble, TruncatesInsideInt64AndRefusesTheRest) {
  EXPECT_EQ(IntOfDouble(3.9), 3);
  EXPECT_EQ(IntOfDouble(-3.9), -3);
  EXPECT_EQ(IntOfDouble(-9223372036854775808.0), std::numeric_limits<int64_t>::min());
  // The largest double below 2^63.
  EXPECT_EQ(IntOfDouble(9223372036854774784.0), int64_t{9223372036854774784});
  for (double bad :
       {9223372036854775808.0, -9223372036854777856.0, 1e300, -1e300,
        std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(),
        std::numeric_limits<double>::quiet_NaN()}) {
    EXPECT_EQ(IntOfDouble(bad), std::nullopt) << bad;
  }
}

}  // namespace common_test
// Issue 38: a file written atomically never writes through a link someone planted at its name,
// and comes out with the mode asked for; a write that fails leaves nothing behind.
TEST(AtomicFile, ReplacesAPlantedLink_NeverWritesThroughIt_ModeAsAsked) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(::testing::TempDir()) / ("atomic-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string victim = (dir / "victim").string();
  const std::string out = (dir / "out").string();
  std::ofstream(victim) << "secret";
  fs::create_symlink(victim, out);
  ASSERT_TRUE(WriteFileAtomically(out, "new bytes").ok());
  auto read = [](const std::string& path) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  };
  EXPECT_EQ(read(victim), "secret") << "written through the planted link";
  EXPECT_FALSE(fs::is_symlink(out));
  EXPECT_EQ(read(out), "new bytes");
  struct stat st {};
  ASSERT_EQ(::stat(out.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_TRUE(WriteFileAtomically(out, "shared", 0644).ok());
  ASSERT_EQ(::stat(out.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);

  const absl::Status missing = WriteFileAtomically((dir / "no-such-dir" / "f").string(), "x");
  EXPECT_EQ(missing.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(missing.message()).find("cannot create a file beside"), std::string::npos);
  int entries = 0;
  for (const auto& e : fs::directory_iterator(dir)) entries += e.is_regular_file() ? 1 : 0;
  EXPECT_EQ(entries, 2) << "only victim and out: no temporary left behind";
  fs::remove_all(dir);
}

// Issue 38: a directory whose contents later reads trust is this user's and private. One of
// ours is narrowed to 0700; another user's, or a link to one, is refused naming the owner (a
// cache planted at the predictable default path before the worker first ran).
TEST(PrivateDirectory, NarrowedWhenOurs_RefusedWhenAnotherUsersOrWorldWritable) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(::testing::TempDir()) / ("private-" + std::to_string(getpid()));
  fs::remove_all(dir);
  const std::string ours = (dir / "cache" / "w0").string();
  ASSERT_TRUE(MakePrivateDirectory(ours, "the cache").ok());
  ::chmod(ours.c_str(), 0777);
  ASSERT_TRUE(MakePrivateDirectory(ours, "the cache").ok());
  struct stat st {};
  ASSERT_EQ(::stat(ours.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  if (::geteuid() != 0) GTEST_SKIP() << "planting another user's directory needs root";
  const std::string planted = (dir / "planted").string();
  fs::create_directories(planted);
  ASSERT_EQ(::chown(planted.c_str(), 65534, 65534), 0);
  const absl::Status refused = MakePrivateDirectory(planted, "the cache");
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(refused.message()).find("belongs to user 65534, not to user 0"),
            std::string::npos)
      << refused;
  const std::string link = (dir / "link").string();
  fs::create_symlink(planted, link);
  EXPECT_EQ(MakePrivateDirectory(link, "the cache").code(), absl::StatusCode::kFailedPrecondition)
      << "a link to another user's directory";
  fs::remove_all(dir);
}

TEST(ThreadSchedstat, Parse_TakesTheKernelsFormatAndRefusesAnythingElse) {
  absl::StatusOr<ThreadSchedstat> s = ParseSchedstat("123456789 4567 89\n");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->on_cpu_ns, 123456789);
  EXPECT_EQ(s->run_queue_ns, 4567);
  EXPECT_EQ(s->slices, 89);
  EXPECT_TRUE(ParseSchedstat("0 0 0").ok());
  for (const char* bad : {"", "\n", "1 2", "1 2 3 4", "1  2 3", " 1 2 3", "1 2 3 ", "-1 2 3",
                          "+1 2 3", "1 2 x", "1 2 3\n\n", "99999999999999999999 1 1"}) {
    absl::StatusOr<ThreadSchedstat> r = ParseSchedstat(bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << "'" << bad << "'";
  }
}

TEST(ThreadSchedstat, ThisThread_CountsTheTimeItRan) {
  // Every kernel the project runs on keeps it (Debian's, and CI's Firecracker 6.18).
  absl::StatusOr<ThreadSchedstat> before = ThisThreadSchedstat();
  ASSERT_TRUE(before.ok()) << before.status();
  // 30 ms of this thread's CPU time by the thread's own clock (however long that takes while
  // other tests share the cores); the statistics lag by at most a scheduler tick or two.
  auto cpu_ns = [] {
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return int64_t{t.tv_sec} * 1'000'000'000 + t.tv_nsec;
  };
  const int64_t cpu_start = cpu_ns();
  const absl::Time give_up = absl::Now() + absl::Seconds(20);
  volatile uint64_t spin = 0;
  while (cpu_ns() - cpu_start < 30'000'000 && absl::Now() < give_up) spin = spin + 1;
  ASSERT_GE(cpu_ns() - cpu_start, 30'000'000) << "the thread got no CPU for 20 s";
  absl::StatusOr<ThreadSchedstat> after = ThisThreadSchedstat();
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_GE(after->on_cpu_ns - before->on_cpu_ns, 20'000'000);
  EXPECT_GE(after->run_queue_ns, before->run_queue_ns);
  EXPECT_GE(after->slices, before->slices);
}

// What Python's YAML 1.1 reader (PyYAML, the one users read hparams.yaml with) takes for a float,
// at the fewest digits that read back exactly.
TEST(YamlFloat, ShortestExactTextThatYaml11ReadsAsAFloat) {
  EXPECT_EQ(YamlFloat(0.05), "0.05");
  EXPECT_EQ(YamlFloat(32.0), "32.0");
  EXPECT_EQ(YamlFloat(-0.0), "-0.0");
  EXPECT_EQ(YamlFloat(1e-05), "1.0e-05");
  EXPECT_EQ(YamlFloat(-2.5e+20), "-2.5e+20");
  EXPECT_EQ(YamlFloat(1e+20), "1.0e+20");
  EXPECT_EQ(YamlFloat(std::numeric_limits<double>::quiet_NaN()), ".nan");
  EXPECT_EQ(YamlFloat(std::numeric_limits<double>::infinity()), ".inf");
  EXPECT_EQ(YamlFloat(-std::numeric_limits<double>::infinity()), "-.inf");
  EXPECT_EQ(YamlFloat(0.1f), "0.1") << "a float at float's precision";
  for (double v : {0.1, 1.0 / 3, 6.02214076e23, 5e-324, std::numeric_limits<double>::max()}) {
    EXPECT_EQ(std::strtod(YamlFloat(v).c_str(), nullptr), v) << YamlFloat(v);
  }
}

}  // namespace dtrain
