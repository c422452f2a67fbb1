#include "coordinator/web/web_access.h"

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/bearer_token.h"

namespace dtrain {
namespace {

constexpr absl::Duration kSessionLifetime = absl::Hours(12);

}  // namespace

std::string WebAccess::SessionOf(const std::string& cookie) {
  for (absl::string_view part : absl::StrSplit(cookie, ';')) {
    part = absl::StripAsciiWhitespace(part);
    if (absl::ConsumePrefix(&part, kCookieName) && absl::ConsumePrefix(&part, "=")) {
      return std::string(part);
    }
  }
  return "";
}

absl::Status WebAccess::Check(const std::string& authorization, const std::string& cookie) const {
  if (!enabled()) return absl::OkStatus();
  if (!authorization.empty()) {
    absl::string_view token = authorization;
    if (!absl::ConsumePrefix(&token, "Bearer ")) {
      return absl::UnauthenticatedError(
          "the Authorization header is not \"Bearer <token>\"; give the cluster's admin token");
    }
    if (SameToken(token, admin_token_)) return absl::OkStatus();
    return absl::UnauthenticatedError("wrong token: this coordinator does not know it");
  }
  const std::string session = SessionOf(cookie);
  if (!session.empty()) {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(session);
    if (it != sessions_.end() && it->second > clock_()) return absl::OkStatus();
    return absl::UnauthenticatedError("the session expired or ended; log in again");
  }
  return absl::UnauthenticatedError(
      "this coordinator requires its admin token: log in on the dashboard, or send "
      "\"Authorization: Bearer <token>\"");
}

absl::Status WebAccess::CheckSameOrigin(const std::string& origin, const std::string& host) const {
  if (origin.empty()) return absl::OkStatus();  // not a browser's cross-site request
  absl::string_view rest = origin;
  if (!absl::ConsumePrefix(&rest, "https://") && !absl::ConsumePrefix(&rest, "http://")) {
    return absl::PermissionDeniedError(
        absl::StrCat("requests from origin '", origin, "' are refused; use the dashboard itself"));
  }
  if (rest != host) {
    return absl::PermissionDeniedError(
        absl::StrCat("a request from another site (", origin,
                     ") may not change anything here; use the dashboard itself"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> WebAccess::Login(const std::string& token) {
  if (enabled() && !SameToken(token, admin_token_)) {
    return absl::UnauthenticatedError("wrong token: this coordinator does not know it");
  }
  const std::string session = NewRandomToken();
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_();
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    it = it->second <= now ? sessions_.erase(it) : std::next(it);
  }
  sessions_[session] = now + kSessionLifetime;
  return absl::StrCat(kCookieName, "=", session, "; Path=/; HttpOnly; SameSite=Strict; Max-Age=",
                      absl::ToInt64Seconds(kSessionLifetime), https_ ? "; Secure" : "");
}

std::string WebAccess::Logout(const std::string& cookie) {
  const std::string session = SessionOf(cookie);
  {
    absl::MutexLock lock(&mu_);
    sessions_.erase(session);
  }
  return absl::StrCat(kCookieName, "=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0",
                      https_ ? "; Secure" : "");
}

}  // namespace dtrain
