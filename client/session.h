// Session: a member's long-lived stream to the coordinator for barriers and boolean decisions
// (Coordinator.Session), sparing each call the setup of a new RPC. One call at a time; the
// caller serializes. A failed call ends the session: open a new one for the next call.
//
// Every call has a deadline: a stream has none per message, so Call() waits at most until
// `deadline` and then cancels the stream and answers DEADLINE_EXCEEDED.
#pragma once

#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/call_canceller.h"
#include "dtrain/v1/coordinator.grpc.pb.h"

namespace dtrain {

class Session final : public grpc::ClientBidiReactor<v1::SessionRequest, v1::SessionResponse> {
 public:
  explicit Session(v1::Coordinator::Stub* stub);
  // Closes the stream and waits (bounded) for gRPC to release it.
  ~Session() override;

  // Sends one request and waits for its response, or the stream's end, or the deadline.
  // `cancel` (may be null) ends the wait, and the stream, while the call runs (the call then
  // fails with CallCanceller::Interruption of its reason); an idle session is left alone.
  absl::StatusOr<v1::SessionResponse> Call(const v1::SessionRequest& request, absl::Time deadline,
                                           CallCanceller* cancel = nullptr);

  // False once the stream has ended (after an error); the owner then opens a new session.
  bool alive() const;

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

 private:
  // Call's request and response, on the stream.
  absl::StatusOr<v1::SessionResponse> Exchange(const v1::SessionRequest& request,
                                               absl::Time deadline);
  // The hold keeps the stream open between calls; OnDone cannot run until it is released,
  // so every path that ends the stream releases it first. Touched by the caller's thread only.
  void ReleaseHold();
  // With mu_ held: lets the stream end (cancelling it first if asked) and waits for OnDone.
  void EndStream(bool cancel) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  grpc::ClientContext context_;
  bool hold_released_ = false;
  v1::SessionRequest request_;
  v1::SessionResponse response_;
  mutable absl::Mutex mu_;
  bool read_done_ ABSL_GUARDED_BY(mu_) = false;
  // gRPC allows one write in flight; the answer to a call can arrive before its write's
  // completion, so the next call waits for it.
  bool write_done_ ABSL_GUARDED_BY(mu_) = true;
  bool read_ok_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dtrain
