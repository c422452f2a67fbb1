// CallCanceller: cancels the gRPC client calls registered with it, including a call registered
// after Cancel (cancelled as it registers). It lets a server handler that waits on another
// service (a worker's Setup waiting in the coordinator's rendezvous) stop waiting when its own
// caller cancels, instead of holding the worker until the wait's deadline. A ProcessGroup's
// collectives use one that is reset (a rank's wait interrupted when its step is cancelled, then
// allowed again for the next step); each registration keeps the reason it was cancelled with,
// so that its call reports it (Interruption) whatever the canceller does afterwards.
#pragma once

#include <atomic>
#include <set>
#include <utility>

#include <grpcpp/client_context.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/synchronization/mutex.h"

namespace dtrain {

class CallCanceller {
 public:
  void Cancel(absl::Status why = absl::CancelledError("cancelled")) {
    absl::MutexLock lock(&mu_);
    cancelled_.store(true, std::memory_order_release);
    why_ = std::move(why);
    for (Registration* r : registrations_) r->CancelLocked(why_);
  }

  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }
  // The same, for code that polls a flag (a download's): true from Cancel until Reset.
  const std::atomic<bool>* flag() const { return &cancelled_; }

  // Calls registered from now on run; those cancelled already stay cancelled.
  void Reset() {
    absl::MutexLock lock(&mu_);
    cancelled_.store(false, std::memory_order_release);
  }

  // `why` marked as the reason a call was cancelled by a CallCanceller (a payload), so that
  // the caller can tell it from a CANCELLED that came from elsewhere (the server).
  static absl::Status Interruption(absl::Status why) {
    if (why.ok()) why = absl::CancelledError("cancelled");
    why.SetPayload(kInterruptionPayload, absl::Cord("1"));
    return why;
  }
  static bool IsInterruption(const absl::Status& status) {
    return status.GetPayload(kInterruptionPayload).has_value();
  }

  // While it lives, `context` is cancelled by Cancel(); at once if Cancel came first. Null
  // cancellers are allowed (nothing to cancel).
  class Registration {
   public:
    Registration(CallCanceller* canceller, grpc::ClientContext* context)
        : canceller_(canceller), context_(context) {
      if (canceller_ == nullptr) return;
      absl::MutexLock lock(&canceller_->mu_);
      canceller_->registrations_.insert(this);
      if (canceller_->cancelled()) CancelLocked(canceller_->why_);
    }
    ~Registration() {
      if (canceller_ == nullptr) return;
      absl::MutexLock lock(&canceller_->mu_);
      canceller_->registrations_.erase(this);
    }
    Registration(const Registration&) = delete;
    Registration& operator=(const Registration&) = delete;

    // `status` (a call's outcome), or Interruption(the reason it was cancelled with) when this
    // registration cancelled the call: a server's own CANCELLED is never taken for ours.
    absl::Status Explain(absl::Status status) const {
      if (status.ok() || status.code() != absl::StatusCode::kCancelled) return status;
      if (canceller_ == nullptr) return status;
      absl::MutexLock lock(&canceller_->mu_);
      return cancelled_with_.ok() ? status : cancelled_with_;
    }

   private:
    friend class CallCanceller;
    void CancelLocked(const absl::Status& why) {
      if (cancelled_with_.ok()) cancelled_with_ = Interruption(why);
      context_->TryCancel();
    }

    CallCanceller* const canceller_;
    grpc::ClientContext* const context_;
    absl::Status cancelled_with_;  // guarded by canceller_->mu_
  };

 private:
  static constexpr char kInterruptionPayload[] = "type.dtrain.dev/interrupted";

  mutable absl::Mutex mu_;
  // Written with mu_ held, so that a registration sees Cancel either before or after it joins.
  std::atomic<bool> cancelled_{false};
  absl::Status why_ ABSL_GUARDED_BY(mu_);
  std::set<Registration*> registrations_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dtrain
