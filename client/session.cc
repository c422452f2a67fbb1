#include "client/session.h"

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"

namespace dtrain {

Session::Session(v1::Coordinator::Stub* stub) {
  stub->async()->Session(&context_, this);
  // Keeps the stream open between calls, when no read or write is in flight.
  AddHold();
  StartCall();
}

Session::~Session() {
  bool done;
  {
    absl::MutexLock lock(&mu_);
    done = done_;
  }
  if (!done) StartWritesDone();
  ReleaseHold();
  if (!done) {
    absl::MutexLock lock(&mu_);
    if (!mu_.AwaitWithTimeout(absl::Condition(&done_), absl::Seconds(5))) {
      context_.TryCancel();
      mu_.Await(absl::Condition(&done_));  // cancellation is local: OnDone follows promptly
    }
  }
}

void Session::ReleaseHold() {
  if (hold_released_) return;
  hold_released_ = true;
  RemoveHold();
}

void Session::EndStream(bool cancel) {
  mu_.Unlock();  // gRPC may run OnDone inline; it takes mu_
  if (cancel) context_.TryCancel();
  ReleaseHold();
  mu_.Lock();
  mu_.Await(absl::Condition(&done_));  // bounded: the stream is ending or cancelled locally
}

bool Session::alive() const {
  absl::MutexLock lock(&mu_);
  return !done_;
}

absl::StatusOr<v1::SessionResponse> Session::Call(const v1::SessionRequest& request,
                                                  absl::Time deadline, CallCanceller* cancel) {
  // A cancellation cancels the stream, which ends the waits of Exchange like any end of it.
  const CallCanceller::Registration registration(cancel, &context_);
  absl::StatusOr<v1::SessionResponse> response = Exchange(request, deadline);
  if (!response.ok()) return registration.Explain(response.status());
  return response;
}

absl::StatusOr<v1::SessionResponse> Session::Exchange(const v1::SessionRequest& request,
                                                      absl::Time deadline) {
  {
    absl::MutexLock lock(&mu_);
    auto writable = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return write_done_ || done_; };
    mu_.AwaitWithDeadline(absl::Condition(&writable), deadline);
    if (done_) return status_.ok() ? absl::UnavailableError("the session has ended") : status_;
    if (!write_done_) {
      EndStream(/*cancel=*/true);
      return absl::DeadlineExceededError(
          "the session's previous message was not sent in time; the connection is stuck");
    }
    read_done_ = false;
    write_done_ = false;
  }
  request_ = request;
  StartWrite(&request_);
  StartRead(&response_);
  absl::MutexLock lock(&mu_);
  // A response, or the end of the stream (its read fails first; OnDone waits for the hold).
  auto answered = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return read_done_ || done_; };
  if (!mu_.AwaitWithDeadline(absl::Condition(&answered), deadline)) {
    EndStream(/*cancel=*/true);
    return absl::DeadlineExceededError(
        "the coordinator did not answer in time (transport deadline); it may be overloaded or "
        "hung");
  }
  if (read_done_ && read_ok_) return response_;
  // The stream ended: its status is this call's error (OK would mean the server hung up).
  EndStream(/*cancel=*/false);
  return status_.ok() ? absl::UnavailableError("the coordinator closed the session") : status_;
}

void Session::OnReadDone(bool ok) {
  absl::MutexLock lock(&mu_);
  read_done_ = true;
  read_ok_ = ok;
}

void Session::OnWriteDone(bool ok) {
  // A failed write means the stream is ending; OnDone brings the status.
  absl::MutexLock lock(&mu_);
  write_done_ = true;
}

void Session::OnDone(const grpc::Status& status) {
  absl::MutexLock lock(&mu_);
  status_ = FromGrpcStatus(status);
  done_ = true;
}

}  // namespace dtrain
