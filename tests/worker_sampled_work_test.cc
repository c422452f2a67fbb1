// A training call's batches named by their sampler (LocalWork.sampled) against the same batches
// listed, on real dtrain-worker processes over gRPC: a ddp job trains bitwise the same either
// way, its packed answers (StepRequest.packed_results) carry the listed answers' values, and a
// sampler that runs past the worker's data, or deals another way, is refused, naming what is
// wrong, with the job left usable.
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/distributed_sampler.h"
#include "common/job_settings.h"
#include "tests/test_support.h"
#include "tests/worker_process.h"
#include "tests/worker_service_fixture.h"

namespace dtrain::testing {
namespace worker_sampled_work_test {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Fewer samples than the split holds (data.limit_train_samples), so that the padding to
// ceil(n / world) and the short last batch both come into it.
constexpr int64_t kSamples = 1000;
constexpr int kBatch = 64;  // 500 a rank: 7 batches of 64 and one of 52

v1::LocalWork Sampled(int64_t first, int64_t count) {
  v1::LocalWork work;
  work.set_first_batch_idx(first);
  v1::SampledBatches* s = work.mutable_sampled();
  s->set_split("train");
  s->set_samples(kSamples);
  s->set_shuffle(true);
  s->set_seed(1);
  s->set_batch_size(kBatch);
  s->set_batch_count(count);
  s->set_deal(kSamplerDeal);
  return work;
}

v1::LocalWork Listed(int rank, int64_t epoch, int64_t first, int64_t count) {
  const std::vector<std::vector<int64_t>> batches = Batches(
      TrainIndices(kSamples, 2, rank, /*streamed=*/false, /*shuffle=*/true, 1, epoch), kBatch);
  v1::LocalWork work;
  work.set_first_batch_idx(first);
  for (int64_t b = first; b < first + count; ++b) {
    v1::IndexBatch* batch = work.add_index_batches();
    batch->set_split("train");
    batch->mutable_indices()->Add(batches[b].begin(), batches[b].end());
  }
  return work;
}

absl::StatusOr<v1::StepResponse> Step(WorkerProcess& w, const std::string& job, int64_t epoch,
                                      bool end_of_epoch, v1::LocalWork work, bool packed) {
  v1::StepRequest request;
  request.set_job_id(job);
  request.set_epoch(epoch);
  request.set_end_of_epoch(end_of_epoch);
  request.set_packed_results(packed);
  *request.add_work() = std::move(work);
  v1::StepResponse response;
  absl::Status s = Call([&](auto* c) { return w.stub().TrainingStep(c, request, &response); });
  if (!s.ok()) return s;
  return response;
}

TEST_F(WorkerServiceTest, Ddp_SampledBatchesTrainAsListedOnes_BitForBit_AnsweredPacked) {
  auto a = StartWorker(), b = StartWorker();
  ASSERT_TRUE(a && b);
  // Per form, per rank: every batch's (size, loss, optimizer stepped, learning rate), and the
  // parameters.
  struct Run {
    std::vector<std::vector<std::tuple<int64_t, double, bool, double>>> batches{2};
    std::map<std::string, std::vector<float>> parameters;
  };
  auto run = [&](const std::string& job, bool sampled) -> Run {
    Run out;
    std::vector<WorkerProcess*> ranks = {a.get(), b.get()};
    std::vector<v1::SetupResponse> setups(2);
    std::vector<absl::Status> statuses(2);
    Parallel(2, [&](int i) {
      v1::SetupRequest request = MakeSetup(job, "ddp", 2, address());
      request.mutable_spec()->mutable_data()->set_limit_train_samples(kSamples);
      statuses[i] = Setup(*ranks[i], request, &setups[i]);
    });
    EXPECT_TRUE(statuses[0].ok() && statuses[1].ok()) << statuses[0] << statuses[1];
    if (!statuses[0].ok() || !statuses[1].ok()) return out;
    EXPECT_EQ(setups[0].sampler_deal(), kSamplerDeal);
    EXPECT_EQ(setups[1].sampler_deal(), kSamplerDeal);
    if (setups[0].ranks(0).rank() == 1) std::swap(ranks[0], ranks[1]);
    // Two epochs, each in two calls: 5 batches, then the last 3 (which end the epoch).
    for (int64_t epoch = 0; epoch < 2; ++epoch) {
      for (const auto& [first, count] : {std::pair<int64_t, int64_t>{0, 5}, {5, 3}}) {
        std::vector<v1::StepResponse> responses(2);
        Parallel(2, [&](int r) {
          absl::StatusOr<v1::StepResponse> answer =
              Step(*ranks[r], job, epoch, first + count == 8,
                   sampled ? Sampled(first, count) : Listed(r, epoch, first, count), sampled);
          statuses[r] = answer.status();
          if (answer.ok()) responses[r] = *std::move(answer);
        });
        EXPECT_TRUE(statuses[0].ok() && statuses[1].ok()) << statuses[0] << statuses[1];
        if (!statuses[0].ok() || !statuses[1].ok()) return out;
        for (int r = 0; r < 2; ++r) {
          const v1::LocalResult& local = responses[r].results(0);
          if (sampled) {
            // A loss and a learning rate (the builtin MLP logs nothing): every batch packed.
            EXPECT_EQ(local.batches_size(), 0);
            const v1::PackedBatchResults& p = local.packed();
            EXPECT_EQ(p.first_batch_idx(), first);
            EXPECT_THAT(p.scalar_names(), ElementsAre("loss"));
            EXPECT_THAT(p.rate_names(), ElementsAre("lr-SGD"));
            EXPECT_EQ(p.sizes_size(), count);
            EXPECT_EQ(p.scalar_values_size(), count);
            EXPECT_EQ(p.optimizer_stepped_size(), count);
            EXPECT_EQ(p.rate_values_size(), count) << "every batch stepped";
            for (int i = 0; i < p.sizes_size() && i < p.scalar_values_size() &&
                            i < p.optimizer_stepped_size() && i < p.rate_values_size();
                 ++i) {
              out.batches[r].emplace_back(p.sizes(i), p.scalar_values(i), p.optimizer_stepped(i),
                                          p.rate_values(i));
            }
          } else {
            EXPECT_FALSE(local.has_packed());
            for (const v1::BatchResult& batch : local.batches()) {
              out.batches[r].emplace_back(batch.size(), batch.scalars().at("loss"),
                                          batch.optimizer_stepped(),
                                          batch.learning_rates().at("lr-SGD"));
            }
          }
        }
      }
    }
    out.parameters = Parameters(*ranks[0], job);
    EXPECT_EQ(MaxDiff(out.parameters, Parameters(*ranks[1], job)), 0.0);
    Parallel(2, [&](int r) { statuses[r] = Teardown(*ranks[r], job); });
    EXPECT_TRUE(statuses[0].ok() && statuses[1].ok());
    return out;
  };
  const Run listed = run("listed", false);
  const Run sampled = run("sampled", true);
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(listed.batches[r].size(), 16u) << "rank " << r;
    EXPECT_EQ(std::get<0>(listed.batches[r][7]), 52) << "the epoch's short last batch";
    EXPECT_EQ(sampled.batches[r], listed.batches[r]) << "rank " << r;
  }
  EXPECT_NE(listed.batches[0], listed.batches[1]) << "the ranks read different samples";
  EXPECT_EQ(MaxDiff(sampled.parameters, listed.parameters), 0.0);
}

TEST_F(WorkerServiceTest, SampledBatchesPastTheData_RefusedSayingWhat_TheJobTrainsOn) {
  auto w = StartWorker();
  ASSERT_TRUE(w);
  v1::SetupResponse setup;
  ASSERT_TRUE(Setup(*w, MakeSetup("bad-sampler", "single_device", 1, address()), &setup).ok());
  EXPECT_EQ(setup.sampler_deal(), "fisher-yates-mt19937_64/1");
  struct Case {
    const char* what;
    std::function<void(v1::LocalWork*)> edit;
    const char* says;
  };
  // The bound is the spec's option (data.batch_size's max), read by the worker.
  const int64_t most_batch =
      static_cast<int64_t>(FindJobSetting("data.batch_size")->setting->max());
  const std::string bound_says =
      absl::StrCat("batch_size is ", most_batch + 1, "; give 1 to ", most_batch);
  const std::vector<Case> cases = {
      {"more samples than the split",
       [](v1::LocalWork* w) { w->mutable_sampled()->set_samples(kTrainSize + 1); },
       "this worker's train split has 1024"},
      {"no samples", [](v1::LocalWork* w) { w->mutable_sampled()->set_samples(0); },
       "deal 0 samples"},
      {"another split", [](v1::LocalWork* w) { w->mutable_sampled()->set_split("val"); },
       "deals only 'train'"},
      {"batch size 0", [](v1::LocalWork* w) { w->mutable_sampled()->set_batch_size(0); },
       "batch_size is 0"},
      {"a batch above the spec's bound",
       [most_batch](v1::LocalWork* w) { w->mutable_sampled()->set_batch_size(most_batch + 1); },
       bound_says.c_str()},
      {"no batches", [](v1::LocalWork* w) { w->mutable_sampled()->set_batch_count(0); },
       "batch_count is 0"},
      {"past the epoch", [](v1::LocalWork* w) { w->set_first_batch_idx(15); },
       "run past the epoch's 16 batches"},
      {"a huge count", [](v1::LocalWork* w) { w->mutable_sampled()->set_batch_count(INT64_MAX); },
       "run past the epoch's 16 batches"},
      {"a negative start", [](v1::LocalWork* w) { w->set_first_batch_idx(-1); },
       "run past the epoch's 16 batches"},
  };
  for (const Case& c : cases) {
    v1::LocalWork work = Sampled(0, 2);
    work.mutable_sampled()->set_samples(kTrainSize);
    c.edit(&work);
    absl::StatusOr<v1::StepResponse> answer = Step(*w, "bad-sampler", 0, false, work, true);
    EXPECT_EQ(answer.status().code(), absl::StatusCode::kInvalidArgument) << c.what;
    EXPECT_THAT(answer.status().message(), HasSubstr(c.says)) << c.what;
  }
  // Another deal: the worker would give ranks other shards than its peers.
  v1::LocalWork other = Sampled(0, 2);
  other.mutable_sampled()->set_samples(kTrainSize);
  other.mutable_sampled()->set_deal("std-shuffle/0");
  absl::StatusOr<v1::StepResponse> refused_deal = Step(*w, "bad-sampler", 0, false, other, true);
  EXPECT_EQ(refused_deal.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused_deal.status().message(),
              HasSubstr("dealt by 'std-shuffle/0'; this worker deals by "
                        "'fisher-yates-mt19937_64/1'"));
  // Evaluation lists its batches.
  v1::StepRequest eval;
  eval.set_job_id("bad-sampler");
  *eval.add_work() = Sampled(0, 1);
  v1::StepResponse ignored;
  const absl::Status refused =
      Call([&](auto* c) { return w->stub().ValidationStep(c, eval, &ignored); });
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("sampled batches are for training calls"));
  // Nothing above trained: the job's first real call starts at step 0 and steps twice.
  v1::LocalWork good = Sampled(14, 2);
  good.mutable_sampled()->set_samples(kTrainSize);
  absl::StatusOr<v1::StepResponse> trained = Step(*w, "bad-sampler", 0, true, good, false);
  ASSERT_TRUE(trained.ok()) << trained.status();
  EXPECT_EQ(trained->results(0).global_step(), 2);
  ASSERT_EQ(trained->results(0).batches_size(), 2) << "not asked to pack: a BatchResult each";
  EXPECT_EQ(trained->results(0).batches(1).batch_idx(), 15);
  // A batch bigger than the samples dealt: the epoch's one batch, short, as a list would be.
  v1::LocalWork whole = Sampled(0, 1);
  whole.mutable_sampled()->set_samples(16);
  whole.mutable_sampled()->set_batch_size(32);
  absl::StatusOr<v1::StepResponse> one = Step(*w, "bad-sampler", 1, true, whole, true);
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_EQ(one->results(0).packed().sizes_size(), 1);
  EXPECT_EQ(one->results(0).packed().sizes(0), 16);
  EXPECT_EQ(one->results(0).global_step(), 3);
  // A listed call asked to pack answers packed too.
  v1::LocalWork listed;
  listed.set_first_batch_idx(1);
  v1::IndexBatch* batch = listed.add_index_batches();
  batch->set_split("train");
  for (int i = 0; i < 8; ++i) batch->add_indices(i);
  absl::StatusOr<v1::StepResponse> packed = Step(*w, "bad-sampler", 1, false, listed, true);
  ASSERT_TRUE(packed.ok()) << packed.status();
  EXPECT_EQ(packed->results(0).batches_size(), 0);
  EXPECT_EQ(packed->results(0).packed().first_batch_idx(), 1);
  ASSERT_EQ(packed->results(0).packed().sizes_size(), 1);
  EXPECT_EQ(packed->results(0).packed().sizes(0), 8);
}

}  // namespace worker_sampled_work_test
}  // namespace dtrain::testing
