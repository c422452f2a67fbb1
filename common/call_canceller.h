// CallCanceller: cancels the gRPC client calls registered with it, including a call registered
// after Cancel (cancelled as it registers). It lets a server handler that waits on another
// service (a worker's Setup waiting in the coordinator's rendezvous) stop waiting when its own
// caller cancels, instead of holding the worker until the wait's deadline. A ProcessGroup's
// collectives use one that is reset (a rank's wait interrupted when its step is cancelled, then
// allowed again for the next step), with the reason its cancelled calls report.
#pragma once

#include <set>
#include <utility>

#include <grpcpp/client_context.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace dtrain {

class CallCanceller {
 public:
  void Cancel(absl::Status why = absl::CancelledError("cancelled")) {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    why_ = std::move(why);
    for (grpc::ClientContext* context : contexts_) context->TryCancel();
  }

  bool cancelled() const {
    absl::MutexLock lock(&mu_);
    return cancelled_;
  }

  // OK unless cancelled; then Cancel's reason.
  absl::Status reason() const {
    absl::MutexLock lock(&mu_);
    return cancelled_ ? why_ : absl::OkStatus();
  }

  // Calls registered from now on run; those cancelled already stay cancelled.
  void Reset() {
    absl::MutexLock lock(&mu_);
    cancelled_ = false;
  }

  // While it lives, `context` is cancelled by Cancel(); at once if Cancel came first. Null
  // cancellers are allowed (nothing to cancel).
  class Registration {
   public:
    Registration(CallCanceller* canceller, grpc::ClientContext* context)
        : canceller_(canceller), context_(context) {
      if (canceller_ == nullptr) return;
      absl::MutexLock lock(&canceller_->mu_);
      canceller_->contexts_.insert(context_);
      if (canceller_->cancelled_) context_->TryCancel();
    }
    ~Registration() {
      if (canceller_ == nullptr) return;
      absl::MutexLock lock(&canceller_->mu_);
      canceller_->contexts_.erase(context_);
    }
    Registration(const Registration&) = delete;
    Registration& operator=(const Registration&) = delete;

   private:
    CallCanceller* const canceller_;
    grpc::ClientContext* const context_;
  };

 private:
  mutable absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status why_ ABSL_GUARDED_BY(mu_);
  std::set<grpc::ClientContext*> contexts_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dtrain
