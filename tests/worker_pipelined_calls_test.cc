// Pipelined training calls at the worker (StepRequest.pipelined): a real dtrain-worker process
// on 127.0.0.1 gets the next call of a job before the last one arrives, as gRPC may hand two
// calls of one connection to its handlers in either order. The call is held until the one it
// follows is queued, refused when that one failed, and bounded in number and time, so that a
// call whose predecessor never comes cannot hold the worker.
#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/test_support.h"
#include "tests/worker_process.h"
#include "tests/worker_service_fixture.h"

namespace dtrain::testing {
namespace worker_pipelined_calls_test {

using ::testing::HasSubstr;

// Rank 0's batches [first, first + 4) of a 1-rank job, sent pipelined.
v1::StepRequest Pipelined(const std::string& job, int first) {
  v1::StepRequest request;
  request.set_job_id(job);
  *request.add_work() = Slice(first, 0, 1, 32, 4);
  request.set_pipelined(true);
  return request;
}

// The call on a thread of its own, as the coordinator's sends it before the one it follows.
struct Sent {
  Sent(WorkerProcess& w, v1::StepRequest r, absl::Duration timeout = absl::Seconds(60))
      : request(std::move(r)), thread([this, &w, timeout] {
          status =
              Call([&](auto* c) { return w.stub().TrainingStep(c, request, &response); }, timeout);
        }) {}
  ~Sent() {
    if (thread.joinable()) thread.join();
  }
  absl::Status Wait() {
    thread.join();
    return status;
  }
  v1::StepRequest request;
  v1::StepResponse response;
  absl::Status status;
  std::thread thread;
};

TEST_F(WorkerServiceTest, PipelinedCall_BeforeItsPredecessor_HeldAndRunAfterIt) {
  auto w = StartWorker();
  ASSERT_NE(w, nullptr);
  // The same batches one call at a time, in order: what the pipelined job must equal.
  ASSERT_TRUE(Setup(*w, MakeSetup("in-order", "single_device", 1, address())).ok());
  ASSERT_TRUE(Train(*w, "in-order", {Slice(0, 0, 1, 32, 4)}).ok());
  ASSERT_TRUE(Train(*w, "in-order", {Slice(4, 0, 1, 32, 4)}).ok());
  const auto in_order = Parameters(*w, "in-order");
  ASSERT_TRUE(Teardown(*w, "in-order").ok());

  ASSERT_TRUE(Setup(*w, MakeSetup("pipe", "single_device", 1, address())).ok());
  Sent second(*w, Pipelined("pipe", 4));
  // It arrived first and waits: nothing runs on the worker meanwhile.
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(Health(*w).state(), v1::HealthResponse::READY);
  auto first = Train(*w, "pipe", {Slice(0, 0, 1, 32, 4)});
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.Wait().ok()) << second.status;
  EXPECT_EQ(first->results(0).global_step(), 4);
  ASSERT_EQ(second.response.results(0).batches_size(), 4);
  EXPECT_EQ(second.response.results(0).batches(0).batch_idx(), 4);
  EXPECT_EQ(second.response.results(0).global_step(), 8) << "it ran after the call it follows";
  EXPECT_EQ(MaxDiff(Parameters(*w, "pipe"), in_order), 0.0);

  // In the usual order (sent right after its predecessor, which is still running) it queues
  // behind it without waiting.
  Sent running(*w, [] {
    v1::StepRequest r;
    r.set_job_id("pipe");
    *r.add_work() = Slice(8, 0, 1, 32, 4);
    return r;
  }());
  Sent next(*w, Pipelined("pipe", 12));
  ASSERT_TRUE(running.Wait().ok()) << running.status;
  ASSERT_TRUE(next.Wait().ok()) << next.status;
  EXPECT_EQ(next.response.results(0).global_step(), 16);

  // Reading the state dict between two calls leaves their order alone: the next one still
  // follows the last training call.
  EXPECT_FALSE(Parameters(*w, "pipe").empty());
  v1::StepRequest after_read = Pipelined("pipe", 16);
  v1::StepResponse response;
  ASSERT_TRUE(Call([&](auto* c) { return w->stub().TrainingStep(c, after_read, &response); }).ok());
  EXPECT_EQ(response.results(0).global_step(), 20);
}

TEST_F(WorkerServiceTest, PipelinedCall_PredecessorFailed_RefusedUntrained) {
  auto w = StartWorker();
  ASSERT_NE(w, nullptr);
  ASSERT_TRUE(Setup(*w, MakeSetup("fails", "single_device", 1, address())).ok());
  Sent second(*w, Pipelined("fails", 4));
  absl::SleepFor(absl::Milliseconds(300));
  v1::StepRequest bad;
  bad.set_job_id("fails");
  *bad.add_work() = Slice(0, 0, 1, 32, 4);
  bad.mutable_work(0)->mutable_index_batches(0)->set_indices(0, kTrainSize + 5);
  v1::StepResponse response;
  const absl::Status failed =
      Call([&](auto* c) { return w->stub().TrainingStep(c, bad, &response); });
  EXPECT_EQ(failed.code(), absl::StatusCode::kInvalidArgument) << failed;
  const absl::Status refused = second.Wait();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("from batch 4 of epoch 0, runs only right after the "
                                           "training call ending there succeeded"));
  EXPECT_THAT(refused.message(), HasSubstr("but the call that ran last on it failed"));
  EXPECT_THAT(refused.message(),
              HasSubstr(absl::StrCat("worker '", Health(*w).worker_name(), "'")));
  // Nothing trained: a call from the start is the job's first step.
  auto again = Train(*w, "fails", {Slice(0, 0, 1, 32, 4)});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->results(0).global_step(), 4);

  // Another call ran between them (a validation): the pipelined one no longer follows.
  v1::StepRequest validate;
  validate.set_job_id("fails");
  v1::IndexBatch* batch = validate.add_work()->add_index_batches();
  batch->set_split("val");
  for (int i = 0; i < 32; ++i) batch->add_indices(i);
  ASSERT_TRUE(Call([&](auto* c) { return w->stub().ValidationStep(c, validate, &response); }).ok());
  v1::StepRequest after = Pipelined("fails", 4);
  const absl::Status overtaken =
      Call([&](auto* c) { return w->stub().TrainingStep(c, after, &response); });
  EXPECT_EQ(overtaken.code(), absl::StatusCode::kFailedPrecondition) << overtaken;
  EXPECT_THAT(overtaken.message(), HasSubstr("but a call other than a training step"));

  // Hostile: pipelined with nothing to order it by.
  v1::StepRequest empty;
  empty.set_job_id("fails");
  empty.set_pipelined(true);
  const absl::Status no_work =
      Call([&](auto* c) { return w->stub().TrainingStep(c, empty, &response); });
  EXPECT_EQ(no_work.code(), absl::StatusCode::kInvalidArgument) << no_work;
  EXPECT_THAT(no_work.message(), HasSubstr("must carry work"));
  v1::StepRequest overflowing = Pipelined("fails", 0);
  overflowing.mutable_work(0)->set_first_batch_idx(INT64_MAX - 1);
  const absl::Status overflow =
      Call([&](auto* c) { return w->stub().TrainingStep(c, overflowing, &response); });
  EXPECT_EQ(overflow.code(), absl::StatusCode::kInvalidArgument) << overflow;
}

TEST_F(WorkerServiceTest, PipelinedCall_PredecessorNeverComes_BoundedInNumberAndTime) {
  auto w = StartWorker();
  ASSERT_NE(w, nullptr);
  ASSERT_TRUE(Setup(*w, MakeSetup("held", "single_device", 1, address())).ok());
  std::vector<std::unique_ptr<Sent>> held;
  for (int i = 0; i < 8; ++i) {
    held.push_back(std::make_unique<Sent>(*w, Pipelined("held", 100 + 10 * i), absl::Seconds(2)));
  }
  absl::SleepFor(absl::Milliseconds(500));
  v1::StepRequest ninth = Pipelined("held", 300);
  v1::StepResponse response;
  const absl::Status full =
      Call([&](auto* c) { return w->stub().TrainingStep(c, ninth, &response); });
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_THAT(full.message(), HasSubstr("already holds 8 pipelined training calls"));
  // Each ends at its caller's deadline, and its place is free again.
  for (auto& sent : held) {
    const absl::Status status = sent->Wait();
    EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  }
  absl::Status later;
  EXPECT_TRUE(WaitFor(
      [&] {
        later = Call([&](auto* c) { return w->stub().TrainingStep(c, ninth, &response); },
                     absl::Milliseconds(200));
        return later.code() == absl::StatusCode::kDeadlineExceeded;
      },
      absl::Seconds(10)))
      << later;
  // The worker goes on training the job.
  auto trained = Train(*w, "held", {Slice(0, 0, 1, 32, 4)});
  ASSERT_TRUE(trained.ok()) << trained.status();
  EXPECT_EQ(trained->results(0).global_step(), 4);

  // A held call of a job torn down is answered then, not at the end of its hold.
  Sent orphan(*w, Pipelined("held", 500));
  absl::SleepFor(absl::Milliseconds(300));
  const absl::Time torn = absl::Now();
  ASSERT_TRUE(Teardown(*w, "held").ok());
  const absl::Status dropped = orphan.Wait();
  EXPECT_EQ(dropped.code(), absl::StatusCode::kCancelled) << dropped;
  EXPECT_THAT(dropped.message(), HasSubstr("job 'held' was torn down"));
  EXPECT_LT(absl::Now() - torn, absl::Seconds(10));
}

// A pipelined call of a job that is not set up here can have no predecessor here: it is refused
// at once, and takes none of the places held calls of the worker's own job need.
TEST_F(WorkerServiceTest, PipelinedCall_OfAJobNotHere_RefusedAtOnce) {
  auto w = StartWorker();
  ASSERT_NE(w, nullptr);
  v1::StepResponse response;
  const absl::Time sent = absl::Now();
  v1::StepRequest none = Pipelined("nobody", 40);
  const absl::Status no_job =
      Call([&](auto* c) { return w->stub().TrainingStep(c, none, &response); });
  EXPECT_EQ(no_job.code(), absl::StatusCode::kFailedPrecondition) << no_job;
  EXPECT_THAT(no_job.message(), HasSubstr("is for job 'nobody', but worker"));
  EXPECT_THAT(no_job.message(), HasSubstr("has no job; call Setup first"));
  EXPECT_LT(absl::Now() - sent, absl::Seconds(10)) << "held for a predecessor that cannot come";
  v1::StepRequest unnamed = Pipelined("", 40);  // as no job is named here either
  const absl::Status unnamed_refused =
      Call([&](auto* c) { return w->stub().TrainingStep(c, unnamed, &response); });
  EXPECT_EQ(unnamed_refused.code(), absl::StatusCode::kFailedPrecondition) << unnamed_refused;

  ASSERT_TRUE(Setup(*w, MakeSetup("mine", "single_device", 1, address())).ok());
  for (int i = 0; i < 10; ++i) {
    v1::StepRequest other = Pipelined("other", 100 + 10 * i);
    const absl::Status refused =
        Call([&](auto* c) { return w->stub().TrainingStep(c, other, &response); });
    EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
    EXPECT_THAT(refused.message(), HasSubstr("is set up for job 'mine'"));
  }
  // The places are the job's own: its next call, sent before the one it follows, is held, then
  // runs once that one comes.
  Sent next(*w, Pipelined("mine", 4));
  absl::SleepFor(absl::Milliseconds(300));
  auto first = Train(*w, "mine", {Slice(0, 0, 1, 32, 4)});
  ASSERT_TRUE(first.ok()) << first.status();
  const absl::Status held = next.Wait();
  ASSERT_TRUE(held.ok()) << held;
  EXPECT_EQ(next.response.results(0).global_step(), 8);
}

// The executor's queue is bounded too: while a Setup waits for its group, 64 calls wait behind
// it and the rest are refused at once, saying why; the waiting ones run when it ends.
TEST_F(WorkerServiceTest, CallsPastTheQueueBound_RefusedAtOnce_TheWaitingOnesRunLater) {
  auto w = StartWorker();
  ASSERT_NE(w, nullptr);
  grpc::ClientContext setup_context;  // cancelled below, once every call has arrived
  setup_context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(120)));
  absl::Status setup;
  std::thread waiting([&] {
    v1::SetupResponse response;
    setup = FromGrpcStatus(
        w->stub().Setup(&setup_context, MakeSetup("alone", "ddp", 2, address()), &response));
  });
  if (!WaitForRegistered("alone", 1)) {
    setup_context.TryCancel();
    waiting.join();
    FAIL() << "the Setup never waited for its group: " << setup;
  }
  constexpr int kCalls = 70;
  std::vector<absl::Status> statuses(kCalls);
  std::atomic<int> refused_so_far{0};
  std::vector<std::thread> calls;
  for (int i = 0; i < kCalls; ++i) {
    calls.emplace_back([&, i] {
      v1::StepRequest step = Pipelined("no-such-job", 10 * i);
      step.set_pipelined(false);
      v1::StepResponse response;
      statuses[i] = Call([&](auto* c) { return w->stub().TrainingStep(c, step, &response); });
      if (statuses[i].code() == absl::StatusCode::kResourceExhausted) ++refused_so_far;
    });
  }
  // Six refusals mean all 70 arrived while the Setup held the executor (64 wait behind it).
  const bool refused =
      WaitFor([&] { return refused_so_far.load() >= kCalls - 64; }, absl::Seconds(60));
  setup_context.TryCancel();
  for (std::thread& t : calls) t.join();
  waiting.join();
  EXPECT_TRUE(refused) << refused_so_far.load() << " refused";
  EXPECT_EQ(setup.code(), absl::StatusCode::kCancelled) << setup;
  int refusals = 0, ran = 0;
  for (const absl::Status& s : statuses) {
    if (s.code() == absl::StatusCode::kResourceExhausted) {
      ++refusals;
      EXPECT_THAT(s.message(), HasSubstr("has 64 calls waiting for its executor (this "
                                         "worker's job is 'alone')"))
          << s;
    } else {
      ++ran;  // run once the Setup ended: there is no job
      EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
      EXPECT_THAT(s.message(), HasSubstr("no job is set up")) << s;
    }
  }
  EXPECT_EQ(refusals, kCalls - 64);
  EXPECT_EQ(ran, 64);
}

}  // namespace worker_pipelined_calls_test
}  // namespace dtrain::testing
