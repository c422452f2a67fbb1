// Who may use the web side, decided for every request before any route runs: the cluster's
// admin token as "Authorization: Bearer <token>" (curl, scripts), or a session cookie the login
// page sets once the token was typed (HttpOnly, SameSite=Strict, Secure over HTTPS; 12 hours).
// State-changing requests (POST) coming from another origin are refused, which with SameSite
// cookies closes cross-site request forgery. Without an admin token every request is allowed
// (the server then listens on loopback only, as the gRPC side does).
//
// Every request must name an allowed host (the Host header), so a page on another domain that
// DNS-rebinds its name to the coordinator cannot read or cancel jobs; an Origin must be an
// allowed host on the port the request came to. Failed logins are limited per client and in
// total, live sessions are capped (the oldest goes), and sessions are looked up by their hash,
// so the lookup's timing says nothing about a session id.
//
// Thread-safety: all methods may be called concurrently.
#pragma once

#include <deque>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace dtrain {

class WebAccess {
 public:
  // `clock` stamps sessions and checks their expiry (tests advance one by hand).
  WebAccess(std::string admin_token, bool https, Clock clock = absl::Now)
      : admin_token_(std::move(admin_token)), https_(https), clock_(std::move(clock)) {}

  bool enabled() const { return !admin_token_.empty(); }

  // The host names requests may name ("*": any), case-insensitive, without ports. Until set,
  // every host is refused.
  void AllowHosts(std::vector<std::string> hosts);

  // PERMISSION_DENIED, naming --http_allowed_hosts, unless `host` (the Host header, with or
  // without a port) names an allowed host.
  absl::Status CheckHost(const std::string& host) const;

  // UNAUTHENTICATED (no or wrong credentials, naming which) unless `authorization` (the header's
  // value) carries the admin token or `cookie` (the Cookie header) a live session.
  absl::Status Check(const std::string& authorization, const std::string& cookie) const;

  // PERMISSION_DENIED when `origin` (the Origin header, "" when absent) is not an allowed host
  // on the port of `host` (the Host header the request came with).
  absl::Status CheckSameOrigin(const std::string& origin, const std::string& host) const;

  // The login: UNAUTHENTICATED for a wrong token; RESOURCE_EXHAUSTED when `client` (its
  // address) failed kMaxFailedLoginsPerClient times in the last minute (whatever the token), or
  // for a wrong token when all clients failed kMaxFailedLogins times; else the Set-Cookie
  // header value of a new session.
  absl::StatusOr<std::string> Login(const std::string& token, const std::string& client = "");
  // POST /login's body, {"token": "..."}, as Login: a body that is not such JSON logs in with no
  // token (and fails as a wrong one does).
  absl::StatusOr<std::string> LoginWithBody(const std::string& json_body,
                                            const std::string& client = "");
  // The Set-Cookie value that ends the session `cookie` names.
  std::string Logout(const std::string& cookie);

  static constexpr char kCookieName[] = "dtrain_session";
  static constexpr int kMaxFailedLoginsPerClient = 5;
  static constexpr int kMaxFailedLogins = 100;
  static constexpr size_t kMaxSessions = 1000;

 private:
  static std::string SessionOf(const std::string& cookie);
  bool HostAllowed(const std::string& name) const;
  // The key a session is kept under: its SHA-256.
  static std::string SessionKey(const std::string& session);
  // Drops failures older than a minute; RESOURCE_EXHAUSTED when `client` may not try now.
  absl::Status CheckLoginRate(const std::string& client) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string admin_token_;
  const bool https_;
  const Clock clock_;
  mutable absl::Mutex mu_;
  std::map<std::string, absl::Time> sessions_ ABSL_GUARDED_BY(mu_);  // SessionKey -> expiry
  std::vector<std::string> allowed_hosts_ ABSL_GUARDED_BY(mu_);
  // Failed logins in the last minute: by client, and all of them.
  std::map<std::string, std::deque<absl::Time>> failures_ ABSL_GUARDED_BY(mu_);
  std::deque<absl::Time> all_failures_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dtrain
