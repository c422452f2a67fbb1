#include "coordinator/web/web_access.h"

#include <algorithm>

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/bearer_token.h"
#include "common/sha256.h"
#include "common/status_macros.h"

namespace dtrain {
namespace {

constexpr absl::Duration kSessionLifetime = absl::Hours(12);
constexpr absl::Duration kLoginWindow = absl::Minutes(1);

// "name", "name:port", "[v6]" or "[v6]:port": the name, lower case, and the port (0 when none).
bool SplitHostPort(absl::string_view authority, std::string* name, int* port) {
  *port = 0;
  absl::string_view host = authority;
  absl::string_view port_text;
  if (absl::StartsWith(host, "[")) {
    const size_t close = host.find(']');
    if (close == absl::string_view::npos) return false;
    port_text = host.substr(close + 1);
    host = host.substr(1, close - 1);
    if (!port_text.empty() && !absl::ConsumePrefix(&port_text, ":")) return false;
  } else if (const size_t colon = host.rfind(':'); colon != absl::string_view::npos) {
    if (host.find(':') != colon) return false;  // a bare IPv6 address is not a Host
    port_text = host.substr(colon + 1);
    host = host.substr(0, colon);
  }
  if (host.empty()) return false;
  if (!port_text.empty() && (!absl::SimpleAtoi(port_text, port) || *port <= 0 || *port > 65535)) {
    return false;
  }
  *name = absl::AsciiStrToLower(host);
  return true;
}

}  // namespace

void WebAccess::AllowHosts(std::vector<std::string> hosts) {
  for (std::string& h : hosts) {
    h = absl::AsciiStrToLower(h);
    if (absl::StartsWith(h, "[") && absl::EndsWith(h, "]")) h = h.substr(1, h.size() - 2);
  }
  absl::MutexLock lock(&mu_);
  allowed_hosts_ = std::move(hosts);
}

bool WebAccess::HostAllowed(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  for (const std::string& allowed : allowed_hosts_) {
    if (allowed == "*" || allowed == name) return true;
  }
  return false;
}

absl::Status WebAccess::CheckHost(const std::string& host) const {
  std::string name;
  int port = 0;
  if (!SplitHostPort(host, &name, &port)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the Host header '", host, "' is not a host name with an optional port"));
  }
  if (HostAllowed(name)) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      "this dashboard does not answer for host '", name,
      "' (a page on another site may be trying to reach it); if that is this coordinator's "
      "name, add it to --http_allowed_hosts"));
}

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
    const std::string key = SessionKey(session);
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(key);
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
  int default_port = 443;
  if (absl::ConsumePrefix(&rest, "http://")) {
    default_port = 80;
  } else if (!absl::ConsumePrefix(&rest, "https://")) {
    return absl::PermissionDeniedError(
        absl::StrCat("requests from origin '", origin, "' are refused; use the dashboard itself"));
  }
  std::string origin_name, host_name;
  int origin_port = 0, host_port = 0;
  // The same allowed name as the request's Host, and the same port where Host gives one (a
  // reverse proxy that terminates TLS forwards Host without the port its browser used).
  const bool same =
      SplitHostPort(rest, &origin_name, &origin_port) &&
      SplitHostPort(host, &host_name, &host_port) && origin_name == host_name &&
      HostAllowed(origin_name) &&
      (host_port == 0 || (origin_port == 0 ? default_port : origin_port) == host_port);
  if (!same) {
    return absl::PermissionDeniedError(
        absl::StrCat("a request from another site (", origin,
                     ") may not change anything here; use the dashboard itself"));
  }
  return absl::OkStatus();
}

std::string WebAccess::SessionKey(const std::string& session) {
  Sha256 hash;
  hash.Update(session);
  return hash.Finish();
}

absl::Status WebAccess::CheckLoginRate(const std::string& client) {
  const absl::Time since = clock_() - kLoginWindow;
  while (!all_failures_.empty() && all_failures_.front() <= since) all_failures_.pop_front();
  for (auto it = failures_.begin(); it != failures_.end();) {
    while (!it->second.empty() && it->second.front() <= since) it->second.pop_front();
    it = it->second.empty() ? failures_.erase(it) : std::next(it);
  }
  auto it = failures_.find(client);
  if (it != failures_.end() && it->second.size() >= kMaxFailedLoginsPerClient) {
    return absl::ResourceExhaustedError(
        absl::StrCat("too many failed logins from ", client.empty() ? "this client" : client, " (",
                     kMaxFailedLoginsPerClient, " a minute); wait a minute and try again"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> WebAccess::LoginWithBody(const std::string& json_body,
                                                     const std::string& client) {
  google::protobuf::Struct body;
  std::string token;
  if (google::protobuf::util::JsonStringToMessage(json_body, &body).ok() &&
      body.fields().count("token") > 0) {
    token = body.fields().at("token").string_value();
  }
  return Login(token, client);
}

absl::StatusOr<std::string> WebAccess::Login(const std::string& token, const std::string& client) {
  absl::MutexLock lock(&mu_);
  DTRAIN_RETURN_IF_ERROR(CheckLoginRate(client));
  const absl::Time now = clock_();
  if (enabled() && !SameToken(token, admin_token_)) {
    // The limit on all clients slows a guesser spread over many addresses; it answers only
    // wrong tokens, so that nobody can lock the right one out.
    if (all_failures_.size() >= kMaxFailedLogins) {
      return absl::ResourceExhaustedError(
          absl::StrCat("too many failed logins on this coordinator (", kMaxFailedLogins,
                       " a minute from all clients); wait a minute and try again"));
    }
    failures_[client].push_back(now);
    all_failures_.push_back(now);
    return absl::UnauthenticatedError("wrong token: this coordinator does not know it");
  }
  const std::string session = NewRandomToken();
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    it = it->second <= now ? sessions_.erase(it) : std::next(it);
  }
  if (sessions_.size() >= kMaxSessions) {
    sessions_.erase(
        std::min_element(sessions_.begin(), sessions_.end(),
                         [](const auto& a, const auto& b) { return a.second < b.second; }));
  }
  sessions_[SessionKey(session)] = now + kSessionLifetime;
  return absl::StrCat(kCookieName, "=", session, "; Path=/; HttpOnly; SameSite=Strict; Max-Age=",
                      absl::ToInt64Seconds(kSessionLifetime), https_ ? "; Secure" : "");
}

std::string WebAccess::Logout(const std::string& cookie) {
  const std::string session = SessionOf(cookie);
  {
    const std::string key = SessionKey(session);
    absl::MutexLock lock(&mu_);
    sessions_.erase(key);
  }
  return absl::StrCat(kCookieName, "=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0",
                      https_ ? "; Secure" : "");
}

}  // namespace dtrain
