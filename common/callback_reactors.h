// Small pieces shared by dtrain's callback-API services (coordinator and worker).
#pragma once

#include <functional>
#include <utility>

#include <grpcpp/server_context.h>
#include <grpcpp/support/server_callback.h>

#include "absl/status/status.h"
#include "common/grpc_status.h"

namespace dtrain {

// A unary reactor finished later (by whoever completes the call); a cancelled call runs
// `on_cancel` so the waiting work can be withdrawn. Deletes itself when done.
class CancellableReactor final : public grpc::ServerUnaryReactor {
 public:
  explicit CancellableReactor(std::function<void()> on_cancel) : on_cancel_(std::move(on_cancel)) {}
  void OnCancel() override {
    if (on_cancel_) on_cancel_();
  }
  void OnDone() override { delete this; }

 private:
  std::function<void()> on_cancel_;
};

// Answers a unary call at once.
inline grpc::ServerUnaryReactor* FinishNow(grpc::CallbackServerContext* context,
                                           const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

}  // namespace dtrain
