// KeyValueClient: the coordinator's key-value store seen from a process, within one scope.
// Usable before any rendezvous (e.g. as the store another engine rendezvouses through).
//
// Thread-safety: all methods may be called concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "dtrain/v1/coordinator.grpc.pb.h"

namespace dtrain {

class KeyValueClient {
 public:
  struct CasResult {
    bool swapped = false;
    bool present = false;
    std::string value;
  };

  KeyValueClient(std::shared_ptr<grpc::Channel> channel, std::string scope,
                 absl::Duration rpc_timeout = absl::Seconds(30));

  absl::Status Set(const std::string& key, const std::string& value);
  // wait zero: NOT_FOUND at once if absent. Otherwise DEADLINE_EXCEEDED after `wait`.
  absl::StatusOr<std::string> Get(const std::string& key,
                                  absl::Duration wait = absl::ZeroDuration());
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta);
  absl::StatusOr<CasResult> CompareAndSet(const std::string& key, const std::string& expected,
                                          const std::string& desired);
  absl::StatusOr<bool> Delete(const std::string& key);
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> List(
      const std::string& prefix = "");

  const std::string& scope() const { return scope_; }

 private:
  void SetDeadline(grpc::ClientContext* context, absl::Duration extra) const;

  std::unique_ptr<v1::Coordinator::Stub> stub_;
  std::string scope_;
  absl::Duration rpc_timeout_;
};

}  // namespace dtrain
