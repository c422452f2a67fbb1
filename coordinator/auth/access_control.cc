#include "coordinator/auth/access_control.h"

#include "absl/strings/str_cat.h"
#include "common/bearer_token.h"

namespace dtrain {

absl::Status Caller::MayUseGroup(absl::string_view group, absl::string_view what) const {
  if (admin() || group == group_) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      what, " in group '", group, "' refused: the token presented was issued for job group '",
      group_, "' and is valid only there"));
}

absl::Status Caller::MayAdminister(absl::string_view what) const {
  if (admin()) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      what, " refused: the token presented was issued for job group '", group_,
      "' and is valid only for that group's calls; ", what, " needs the cluster's admin token"));
}

AccessControl::AccessControl(std::string admin_token) : admin_token_(std::move(admin_token)) {}

absl::StatusOr<Caller> AccessControl::Authenticate(const grpc::ServerContextBase& context) const {
  if (!enabled()) return Caller::Admin();
  absl::StatusOr<absl::string_view> token = RequireBearerToken(context);
  if (!token.ok()) return token.status();
  if (SameToken(*token, admin_token_)) return Caller::Admin();
  {
    // A hash lookup on the token itself: its timing reveals at most whether some job token
    // shares a hash bucket, nothing an attacker can steer towards a 256-bit secret.
    absl::MutexLock lock(&mu_);
    auto it = job_groups_.find(*token);
    if (it != job_groups_.end()) return Caller::OfJob(it->second);
  }
  return absl::UnauthenticatedError(
      "the bearer token presented is not valid on this coordinator (a wrong admin token, or the "
      "token of a job that has ended)");
}

std::string AccessControl::IssueJobToken(const std::string& group) {
  if (!enabled()) return "";
  std::string token = NewRandomToken();
  absl::MutexLock lock(&mu_);
  job_groups_[token] = group;
  return token;
}

void AccessControl::RevokeJobToken(const std::string& token) {
  if (token.empty()) return;
  absl::MutexLock lock(&mu_);
  job_groups_.erase(token);
}

size_t AccessControl::job_tokens() const {
  absl::MutexLock lock(&mu_);
  return job_groups_.size();
}

absl::Status AccessControl::RequireAdmin(const grpc::ServerContextBase& context,
                                         absl::string_view what) const {
  absl::StatusOr<Caller> caller = Authenticate(context);
  if (!caller.ok()) return caller.status();
  return caller->MayAdminister(what);
}

}  // namespace dtrain
