// Who may use the web side, decided for every request before any route runs: the cluster's
// admin token as "Authorization: Bearer <token>" (curl, scripts), or a session cookie the login
// page sets once the token was typed (HttpOnly, SameSite=Strict, Secure over HTTPS; 12 hours).
// State-changing requests (POST) coming from another origin are refused, which with SameSite
// cookies closes cross-site request forgery. Without an admin token every request is allowed
// (the server then listens on loopback only, as the gRPC side does).
//
// Thread-safety: all methods may be called concurrently.
#pragma once

#include <map>
#include <string>

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

  // UNAUTHENTICATED (no or wrong credentials, naming which) unless `authorization` (the header's
  // value) carries the admin token or `cookie` (the Cookie header) a live session.
  absl::Status Check(const std::string& authorization, const std::string& cookie) const;

  // PERMISSION_DENIED when `origin` (the Origin header, "" when absent) names another site than
  // `host` (the Host header).
  absl::Status CheckSameOrigin(const std::string& origin, const std::string& host) const;

  // The login: UNAUTHENTICATED for a wrong token; else the Set-Cookie header value of a new
  // session.
  absl::StatusOr<std::string> Login(const std::string& token);
  // The Set-Cookie value that ends the session `cookie` names.
  std::string Logout(const std::string& cookie);

  static constexpr char kCookieName[] = "dtrain_session";

 private:
  static std::string SessionOf(const std::string& cookie);

  const std::string admin_token_;
  const bool https_;
  const Clock clock_;
  mutable absl::Mutex mu_;
  std::map<std::string, absl::Time> sessions_ ABSL_GUARDED_BY(mu_);  // id -> expiry
};

}  // namespace dtrain
