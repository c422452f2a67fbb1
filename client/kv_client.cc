#include "client/kv_client.h"

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>

#include "common/grpc_status.h"

namespace dtrain {

KeyValueClient::KeyValueClient(std::shared_ptr<grpc::Channel> channel, std::string scope,
                               absl::Duration rpc_timeout)
    : stub_(v1::Coordinator::NewStub(channel)),
      scope_(std::move(scope)),
      rpc_timeout_(rpc_timeout) {}

void KeyValueClient::SetDeadline(grpc::ClientContext* context, absl::Duration extra) const {
  context->set_deadline(absl::ToChronoTime(absl::Now() + rpc_timeout_ + extra));
}

absl::Status KeyValueClient::Set(const std::string& key, const std::string& value) {
  grpc::ClientContext context;
  SetDeadline(&context, absl::ZeroDuration());
  v1::KeyValueSetRequest request;
  request.set_scope(scope_);
  request.set_key(key);
  request.set_value(value);
  v1::KeyValueSetResponse response;
  return FromGrpcStatus(stub_->KeyValueSet(&context, request, &response));
}

absl::StatusOr<std::string> KeyValueClient::Get(const std::string& key, absl::Duration wait) {
  grpc::ClientContext context;
  // The server answers DEADLINE_EXCEEDED itself when `wait` runs out; the transport deadline
  // only guards against a coordinator that stopped answering.
  SetDeadline(&context, wait);
  v1::KeyValueGetRequest request;
  request.set_scope(scope_);
  request.set_key(key);
  request.set_wait_timeout_ms(absl::ToInt64Milliseconds(wait));
  v1::KeyValueGetResponse response;
  grpc::Status status = stub_->KeyValueGet(&context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return std::move(*response.mutable_value());
}

absl::StatusOr<int64_t> KeyValueClient::Add(const std::string& key, int64_t delta) {
  grpc::ClientContext context;
  SetDeadline(&context, absl::ZeroDuration());
  v1::KeyValueAddRequest request;
  request.set_scope(scope_);
  request.set_key(key);
  request.set_delta(delta);
  v1::KeyValueAddResponse response;
  grpc::Status status = stub_->KeyValueAdd(&context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response.value();
}

absl::StatusOr<KeyValueClient::CasResult> KeyValueClient::CompareAndSet(
    const std::string& key, const std::string& expected, const std::string& desired) {
  grpc::ClientContext context;
  SetDeadline(&context, absl::ZeroDuration());
  v1::KeyValueCompareAndSetRequest request;
  request.set_scope(scope_);
  request.set_key(key);
  request.set_expected(expected);
  request.set_desired(desired);
  v1::KeyValueCompareAndSetResponse response;
  grpc::Status status = stub_->KeyValueCompareAndSet(&context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return CasResult{response.swapped(), response.present(), response.value()};
}

absl::StatusOr<bool> KeyValueClient::Delete(const std::string& key) {
  grpc::ClientContext context;
  SetDeadline(&context, absl::ZeroDuration());
  v1::KeyValueDeleteRequest request;
  request.set_scope(scope_);
  request.set_key(key);
  v1::KeyValueDeleteResponse response;
  grpc::Status status = stub_->KeyValueDelete(&context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response.deleted();
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> KeyValueClient::List(
    const std::string& prefix) {
  v1::KeyValueListRequest request;
  request.set_scope(scope_);
  request.set_prefix(prefix);
  std::vector<std::pair<std::string, std::string>> out;
  do {
    grpc::ClientContext context;
    SetDeadline(&context, absl::ZeroDuration());
    v1::KeyValueListResponse response;
    grpc::Status status = stub_->KeyValueList(&context, request, &response);
    if (!status.ok()) return FromGrpcStatus(status);
    // A page resumes after the last key of the one before: the same token again is no
    // progress, and asking on would never end.
    if (!response.next_page_token().empty() && response.next_page_token() == request.page_token()) {
      return absl::InternalError("the coordinator answered KeyValueList's page with its own token");
    }
    for (auto& e : *response.mutable_entries()) {
      out.emplace_back(std::move(*e.mutable_key()), std::move(*e.mutable_value()));
    }
    request.set_page_token(response.next_page_token());
  } while (!request.page_token().empty());
  return out;
}

}  // namespace dtrain
