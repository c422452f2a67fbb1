// ParallelCalls (common/parallel_calls.h): every call of a Run starts at once, even when the
// calls wait for each other like a collective's ranks; threads are kept between Runs; one
// failure cancels the rest after the grace period (a real gRPC call to a peer that never
// answers).
#include "common/parallel_calls.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <set>
#include <thread>

#include <grpcpp/create_channel.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "dtrain/v1/workers.grpc.pb.h"

namespace dtrain {
namespace parallel_calls_test {

// Every call waits until all n of this Run have started (as the ranks of one step do).
struct Rendezvous {
  absl::Mutex mu;
  int arrived = 0;
  std::set<std::thread::id> threads;
};

grpc::Status WaitForAll(Rendezvous* r, int n) {
  absl::MutexLock lock(&r->mu);
  ++r->arrived;
  r->threads.insert(std::this_thread::get_id());
  auto all = [r, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(r->mu) { return r->arrived >= n; };
  if (!r->mu.AwaitWithTimeout(absl::Condition(&all), absl::Seconds(10))) {
    return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                        absl::StrCat(r->arrived, " of ", n, " calls started"));
  }
  return grpc::Status::OK;
}

TEST(ParallelCalls, CallsThatWaitForEachOther_AllStart_AndThreadsAreKeptBetweenRuns) {
  ParallelCalls calls;
  std::set<std::thread::id> seen;
  // Growing, shrinking and growing again: the pool must never queue a call behind another.
  for (int n : {4, 2, 6, 6, 1}) {
    Rendezvous r;
    const std::vector<grpc::Status> results =
        calls.Run(n, [&](int, grpc::ClientContext*) { return WaitForAll(&r, n); });
    ASSERT_EQ(results.size(), static_cast<size_t>(n));
    for (int i = 0; i < n; ++i)
      EXPECT_TRUE(results[i].ok()) << i << ": " << results[i].error_message();
    EXPECT_EQ(r.threads.size(), static_cast<size_t>(n));
    seen.insert(r.threads.begin(), r.threads.end());
  }
  // Kept threads: far fewer than the 19 calls (a thread still finishing its last call when
  // the next Run starts is not counted idle, so a few more than 6 may exist).
  EXPECT_GE(seen.size(), 6u);
  EXPECT_LE(seen.size(), 12u);
  EXPECT_EQ(seen.count(std::this_thread::get_id()), 0u);
}

TEST(ParallelCalls, ResultsAreInCallOrder) {
  ParallelCalls calls;
  // The calls finish in reverse order: each waits for the next one to finish first.
  absl::Notification finished[5];
  absl::Mutex mu;
  std::vector<int> finish_order;
  const std::vector<grpc::Status> results = calls.Run(5, [&](int i, grpc::ClientContext*) {
    if (i + 1 < 5) finished[i + 1].WaitForNotificationWithTimeout(absl::Seconds(10));
    {
      absl::MutexLock lock(&mu);
      finish_order.push_back(i);
    }
    finished[i].Notify();
    return grpc::Status(i % 2 == 0 ? grpc::StatusCode::OK : grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("call ", i));
  });
  EXPECT_EQ(finish_order, (std::vector<int>{4, 3, 2, 1, 0})) << "the calls did not run at once";
  ASSERT_EQ(results.size(), 5u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(results[i].ok(), i % 2 == 0) << i;
    if (i % 2 == 1) {
      EXPECT_EQ(results[i].error_message(), absl::StrCat("call ", i));
    }
  }
}

// A listening socket that never speaks HTTP/2: a call to it waits until cancelled.
class SilentPeer {
 public:
  SilentPeer() : fd_(socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (fd_ >= 0 && bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
        listen(fd_, 16) == 0 && getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      port_ = ntohs(addr.sin_port);
    }
  }
  ~SilentPeer() {
    if (fd_ >= 0) close(fd_);
  }
  bool listening() const { return port_ != 0; }
  std::unique_ptr<v1::Workers::Stub> Stub() const {
    return v1::Workers::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port_), grpc::InsecureChannelCredentials()));
  }

 private:
  int fd_;
  int port_ = 0;
};

TEST(ParallelCalls, OneFailure_CancelsACallToASilentPeerAfterTheGrace) {
  SilentPeer peer;
  ASSERT_TRUE(peer.listening());
  auto stub = peer.Stub();

  ParallelCalls calls;
  const absl::Time start = absl::Now();
  const std::vector<grpc::Status> results = calls.Run(
      2,
      [&](int i, grpc::ClientContext* context) {
        if (i == 0) return grpc::Status(grpc::StatusCode::INTERNAL, "rank 0 broke");
        context->set_wait_for_ready(true);
        v1::RegisterWorkerRequest request;
        v1::RegisterWorkerResponse response;
        return stub->RegisterWorker(context, request, &response);
      },
      /*grace=*/absl::Milliseconds(200), absl::Now() + absl::Seconds(60));
  const absl::Duration took = absl::Now() - start;
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[0].error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_EQ(results[1].error_code(), grpc::StatusCode::CANCELLED) << results[1].error_message();
  EXPECT_GE(took, absl::Milliseconds(200));
  EXPECT_LT(took, absl::Seconds(10));

  // The instance is still usable after a cancelled Run.
  Rendezvous r;
  const std::vector<grpc::Status> again =
      calls.Run(2, [&](int, grpc::ClientContext*) { return WaitForAll(&r, 2); });
  EXPECT_TRUE(again[0].ok() && again[1].ok());
}

TEST(ParallelCalls, RunAsync_OneFailure_CancelsACallbackCallToASilentPeer) {
  SilentPeer peer;
  ASSERT_TRUE(peer.listening());
  auto stub = peer.Stub();

  ParallelCalls calls;
  v1::RegisterWorkerRequest request;
  std::vector<v1::RegisterWorkerResponse> responses(3);
  const absl::Time start = absl::Now();
  const std::vector<grpc::Status> results = calls.RunAsync(
      3,
      [&](int i, grpc::ClientContext* context, ParallelCalls::Done done) {
        if (i == 1) {
          // Completes from another thread, later, as a callback would.
          std::thread([done] {
            absl::SleepFor(absl::Milliseconds(50));
            done(grpc::Status(grpc::StatusCode::UNAVAILABLE, "rank 1 died"));
          }).detach();
          return;
        }
        context->set_wait_for_ready(true);
        stub->async()->RegisterWorker(context, &request, &responses[i], std::move(done));
      },
      /*grace=*/absl::Milliseconds(200), absl::Now() + absl::Seconds(60));
  const absl::Duration took = absl::Now() - start;
  ASSERT_EQ(results.size(), 3u);
  EXPECT_EQ(results[0].error_code(), grpc::StatusCode::CANCELLED) << results[0].error_message();
  EXPECT_EQ(results[1].error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(results[1].error_message(), "rank 1 died");
  EXPECT_EQ(results[2].error_code(), grpc::StatusCode::CANCELLED) << results[2].error_message();
  EXPECT_GE(took, absl::Milliseconds(250));
  EXPECT_LT(took, absl::Seconds(10));
}

}  // namespace parallel_calls_test
}  // namespace dtrain
