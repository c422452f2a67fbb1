// AccessControl: who may call what on the coordinator. Every gRPC edge of dtrain-coordinator asks
// it: the process-group server's Coordinator service, the job side's Workers and Jobs services
// and the artifact store's Artifacts service (the dashboard checks the admin token itself,
// coordinator/web/web_access.h).
//
// Two kinds of bearer token (common/bearer_token.h):
//   - the cluster's admin token (--token): every RPC, as the CLI, the workers' daemons and
//     programs using ProcessGroup directly need;
//   - a job token, issued when a job starts and revoked when it ends, handed to that job's
//     workers (GroupSpec.token): only calls inside the job's own group (join, heartbeats,
//     collectives, and the key-value scope named after the group). With it, a rank of job A
//     cannot join, read or run collectives in job B, nor submit or list jobs.
// Without an admin token, access control is off and every caller is an admin (the loopback
// demo); no job tokens are issued then.
//
// Thread-safety: all methods are safe to call concurrently.
#pragma once

#include <string>

#include <grpcpp/server_context.h>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace dtrain {

// An authenticated caller.
class Caller {
 public:
  static Caller Admin() { return Caller(""); }
  static Caller OfJob(std::string group) { return Caller(std::move(group)); }

  bool admin() const { return group_.empty(); }
  // A job token's group; "" for an admin.
  const std::string& group() const { return group_; }

  // OK for an admin or for a job token of `group`; PERMISSION_DENIED naming both groups
  // otherwise. `what` names the call, e.g. "all_reduce".
  absl::Status MayUseGroup(absl::string_view group, absl::string_view what) const;
  // OK for an admin; PERMISSION_DENIED otherwise.
  absl::Status MayAdminister(absl::string_view what) const;

 private:
  explicit Caller(std::string group) : group_(std::move(group)) {}
  std::string group_;  // empty: admin
};

class AccessControl {
 public:
  // Empty `admin_token`: access control off.
  explicit AccessControl(std::string admin_token);

  bool enabled() const { return !admin_token_.empty(); }

  // Who presents the call's token; UNAUTHENTICATED if nobody we know.
  absl::StatusOr<Caller> Authenticate(const grpc::ServerContextBase& context) const;
  // OK when the call presents the admin token (or access control is off); UNAUTHENTICATED or
  // PERMISSION_DENIED naming `what` otherwise.
  absl::Status RequireAdmin(const grpc::ServerContextBase& context, absl::string_view what) const;

  // A new token for `group`'s members (empty when access control is off). The caller keeps it
  // secret and revokes it when the job ends.
  std::string IssueJobToken(const std::string& group);
  void RevokeJobToken(const std::string& token);
  size_t job_tokens() const;

 private:
  const std::string admin_token_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::string> job_groups_ ABSL_GUARDED_BY(mu_);  // token → group
};

}  // namespace dtrain
