// Who may use the dashboard, and over what: the admin token as a bearer token or as the session
// cookie /login gives, failed logins limited per client and in total, a session's 12 hours and
// the cap on sessions (WebAccess), HTTPS with the cluster's certificate and a Secure cookie, and
// a coordinator that refuses to serve the API beyond loopback without a token, or a token
// without TLS.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "coordinator/web/web_access.h"
#include "dtrain/v1/cluster.pb.h"
#include "tests/local_cluster.h"
#include "tests/web_api_fixture.h"

namespace dtrain::testing {
namespace web_api_auth_test {

using ::testing::HasSubstr;
using ::testing::Not;

TEST_F(WebApiTest, AdminToken_BearerOrSessionCookie_WrongTokenRefused) {
  const std::string token_file = ::testing::TempDir() + "/web-token-" + std::to_string(getpid());
  std::ofstream(token_file) << "web-admin-token-123\n";
  ASSERT_NO_FATAL_FAILURE(Start({"--token_file=" + token_file}));
  auto anonymous = http_->Get("/api/v1/jobs");
  ASSERT_TRUE(anonymous);
  EXPECT_EQ(anonymous->status, 401);
  EXPECT_EQ(ErrorCode(anonymous->body), "UNAUTHENTICATED");
  auto page = http_->Get("/");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 401);
  EXPECT_THAT(page->body, HasSubstr("needs its admin token")) << "the login page";
  httplib::Headers wrong = {{"Authorization", "Bearer not-the-token"}};
  auto refused = http_->Get("/api/v1/jobs", wrong);
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 401);
  EXPECT_THAT(refused->body, HasSubstr("wrong token"));
  httplib::Headers right = {{"Authorization", "Bearer web-admin-token-123"}};
  auto allowed = http_->Get("/api/v1/jobs", right);
  ASSERT_TRUE(allowed);
  EXPECT_EQ(allowed->status, 200);

  auto bad_login = http_->Post("/login", R"({"token": "guess"})", "application/json");
  ASSERT_TRUE(bad_login);
  EXPECT_EQ(bad_login->status, 401);
  EXPECT_FALSE(bad_login->has_header("Set-Cookie"));
  auto login = http_->Post("/login", R"({"token": "web-admin-token-123"})", "application/json");
  ASSERT_TRUE(login);
  ASSERT_EQ(login->status, 200);
  const std::string cookie = login->get_header_value("Set-Cookie");
  EXPECT_THAT(cookie, HasSubstr("HttpOnly"));
  EXPECT_THAT(cookie, HasSubstr("SameSite=Strict"));
  EXPECT_THAT(cookie, HasSubstr("; Max-Age=43200")) << "12 hours";
  EXPECT_THAT(cookie, Not(HasSubstr("Secure"))) << "a Secure cookie never comes back over HTTP";
  httplib::Headers session = {{"Cookie", cookie.substr(0, cookie.find(';'))}};
  auto with_cookie = http_->Get("/api/v1/cluster", session);
  ASSERT_TRUE(with_cookie);
  EXPECT_EQ(with_cookie->status, 200);
  auto logout = http_->Post("/logout", session, "", "text/plain");
  ASSERT_TRUE(logout);
  auto after = http_->Get("/api/v1/cluster", session);
  ASSERT_TRUE(after);
  EXPECT_EQ(after->status, 401);
  std::filesystem::remove(token_file);
}

// Failed logins are limited per client before the token is even compared: the sixth attempt in
// a minute is refused, the right token included.
TEST_F(WebApiTest, FailedLogins_RateLimited_RightTokenRefusedTooUntilAMinutePasses) {
  const std::string token_file = ::testing::TempDir() + "/web-rate-" + std::to_string(getpid());
  std::ofstream(token_file) << "web-admin-token-456\n";
  ASSERT_NO_FATAL_FAILURE(Start({"--token_file=" + token_file}));
  for (int i = 0; i < WebAccess::kMaxFailedLoginsPerClient; ++i) {
    auto wrong = http_->Post("/login", R"({"token": "guess"})", "application/json");
    ASSERT_TRUE(wrong);
    EXPECT_EQ(wrong->status, 401) << "attempt " << i;
  }
  auto limited = http_->Post("/login", R"({"token": "web-admin-token-456"})", "application/json");
  ASSERT_TRUE(limited);
  EXPECT_EQ(limited->status, 429);
  EXPECT_EQ(ErrorCode(limited->body), "RESOURCE_EXHAUSTED");
  EXPECT_THAT(limited->body, HasSubstr("too many failed logins from 127.0.0.1"));
  auto bearer = http_->Get("/api/v1/jobs", {{"Authorization", "Bearer web-admin-token-456"}});
  ASSERT_TRUE(bearer);
  EXPECT_EQ(bearer->status, 200) << "the limit is on logins, not on scripts holding the token";
}

// With the gRPC side on TLS, the dashboard is HTTPS with the same certificate: a client trusting
// the cluster's CA reads it; plaintext gets nothing.
TEST_F(WebApiTest, TlsCoordinator_ServesHttpsWithItsCertificate) {
  const std::string certs = absl::StrCat(::testing::TempDir(), "/web-tls-", getpid());
  CommandResult made =
      RunShell(absl::StrCat("bash " DTRAIN_SOURCE_DIR "/deploy/tls/make-test-certs.sh ", certs));
  ASSERT_EQ(made.exit_code, 0) << made.output;
  ASSERT_NO_FATAL_FAILURE(
      Start({"--tls_cert=" + certs + "/server.pem", "--tls_key=" + certs + "/server.key",
             "--tls_ca=" + certs + "/ca.pem"}));
  httplib::SSLClient https("127.0.0.1", port_);
  https.set_ca_cert_path((certs + "/ca.pem").c_str());
  https.enable_server_certificate_verification(true);
  auto secure = https.Get("/api/v1/cluster");
  ASSERT_TRUE(secure) << httplib::to_string(secure.error());
  EXPECT_EQ(secure->status, 200);
  Parse<v1::ClusterSummary>(secure->body);
  auto plain = http_->Get("/api/v1/cluster");
  EXPECT_FALSE(plain && plain->status == 200) << "plaintext HTTP answered";
  std::filesystem::remove_all(certs);
}

// Over HTTPS the session cookie is Secure (and still HttpOnly, SameSite=Strict, 12 hours).
TEST_F(WebApiTest, HttpsLogin_SessionCookieIsSecure) {
  const std::string certs = TestTempPath("certs");
  CommandResult made =
      RunShell(absl::StrCat("bash " DTRAIN_SOURCE_DIR "/deploy/tls/make-test-certs.sh ", certs));
  ASSERT_EQ(made.exit_code, 0) << made.output;
  const std::string token_file = TestTempPath("token");
  std::ofstream(token_file) << "tls-admin-token\n";
  ASSERT_NO_FATAL_FAILURE(
      Start({"--tls_cert=" + certs + "/server.pem", "--tls_key=" + certs + "/server.key",
             "--tls_ca=" + certs + "/ca.pem", "--token_file=" + token_file}));
  httplib::SSLClient https("127.0.0.1", port_);
  https.set_ca_cert_path((certs + "/ca.pem").c_str());
  https.enable_server_certificate_verification(true);
  auto login = https.Post("/login", R"({"token": "tls-admin-token"})", "application/json");
  ASSERT_TRUE(login) << httplib::to_string(login.error());
  ASSERT_EQ(login->status, 200) << login->body;
  const std::string cookie = login->get_header_value("Set-Cookie");
  EXPECT_THAT(cookie, HasSubstr("; Secure"));
  EXPECT_THAT(cookie, HasSubstr("HttpOnly"));
  EXPECT_THAT(cookie, HasSubstr("SameSite=Strict"));
  EXPECT_THAT(cookie, HasSubstr("; Max-Age=43200"));
  auto with_cookie = https.Get("/api/v1/cluster", {{"Cookie", cookie.substr(0, cookie.find(';'))}});
  ASSERT_TRUE(with_cookie);
  EXPECT_EQ(with_cookie->status, 200);
  auto logout =
      https.Post("/logout", {{"Cookie", cookie.substr(0, cookie.find(';'))}}, "", "text/plain");
  ASSERT_TRUE(logout);
  EXPECT_THAT(logout->get_header_value("Set-Cookie"), HasSubstr("Max-Age=0; Secure"));
}

TEST(WebApiStart, BeyondLoopbackWithoutAToken_Refused) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/web-refused-", getpid());
  CommandResult run = RunShell(absl::StrCat(DTRAIN_COORDINATOR_BIN,
                                            " --listen=127.0.0.1:0 --http_listen=0.0.0.0:0 "
                                            "--state_dir=",
                                            dir, " 2>&1"));
  EXPECT_NE(run.exit_code, 0);
  EXPECT_THAT(run.output, HasSubstr("is beyond loopback and the coordinator has no admin token"));
  std::filesystem::remove_all(dir);
}

// A token beyond loopback travels only under TLS (as on the gRPC side), unless --insecure.
TEST(WebApiStart, TokenBeyondLoopbackWithoutTls_Refused) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/web-no-tls-", getpid());
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/token") << "some-admin-token\n";
  CommandResult run = RunShell(absl::StrCat(
      DTRAIN_COORDINATOR_BIN, " --listen=127.0.0.1:0 --http_listen=0.0.0.0:0 --token_file=", dir,
      "/token --state_dir=", dir, "/state 2>&1"));
  EXPECT_NE(run.exit_code, 0);
  EXPECT_THAT(run.output,
              HasSubstr("is beyond loopback with an admin token but without TLS: the token and "
                        "session cookies would cross the network in clear"));
  std::filesystem::remove_all(dir);
}

// The session's 12 hours hold on the server too, not only in the browser's Max-Age.
TEST(WebAccess, SessionAcceptedForTwelveHours_ThenRefused) {
  absl::Time now = absl::FromUnixSeconds(1767225600);
  WebAccess access("admin-token", /*https=*/false, [&] { return now; });
  auto cookie = access.Login("admin-token");
  ASSERT_TRUE(cookie.ok()) << cookie.status();
  const std::string session = cookie->substr(0, cookie->find(';'));
  now += absl::Hours(12) - absl::Seconds(1);
  EXPECT_TRUE(access.Check("", session).ok());
  now += absl::Seconds(1);
  const absl::Status expired = access.Check("", session);
  EXPECT_EQ(expired.code(), absl::StatusCode::kUnauthenticated) << expired;
  EXPECT_THAT(std::string(expired.message()), HasSubstr("expired"));
  EXPECT_EQ(access.Login("wrong").status().code(), absl::StatusCode::kUnauthenticated);
}

// Sessions: capped (the oldest goes), looked up by hash; failed logins limited per client and in
// total, for a minute.
TEST(WebAccess, SessionsCapped_LoginFailuresLimitedPerClientAndInTotal) {
  absl::Time now = absl::FromUnixSeconds(1767225600);
  WebAccess access("admin-token", /*https=*/false, [&] { return now; });
  std::vector<std::string> sessions;
  for (size_t i = 0; i <= WebAccess::kMaxSessions; ++i) {
    now += absl::Milliseconds(1);
    auto cookie = access.Login("admin-token", "10.0.0.1");
    ASSERT_TRUE(cookie.ok()) << cookie.status();
    sessions.push_back(cookie->substr(0, cookie->find(';')));
  }
  EXPECT_EQ(access.Check("", sessions.front()).code(), absl::StatusCode::kUnauthenticated)
      << "the oldest session made room";
  EXPECT_TRUE(access.Check("", sessions[1]).ok());
  EXPECT_TRUE(access.Check("", sessions.back()).ok());

  for (int i = 0; i < WebAccess::kMaxFailedLoginsPerClient; ++i) {
    EXPECT_EQ(access.Login("wrong", "10.0.0.2").status().code(),
              absl::StatusCode::kUnauthenticated);
  }
  EXPECT_EQ(access.Login("admin-token", "10.0.0.2").status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(access.Login("admin-token", "10.0.0.3").ok()) << "another client is not limited";
  now += absl::Minutes(1);
  EXPECT_TRUE(access.Login("admin-token", "10.0.0.2").ok()) << "a minute later";

  for (int i = 0; i < WebAccess::kMaxFailedLogins; ++i) {
    (void)access.Login("wrong", absl::StrCat("10.1.", i / 256, ".", i % 256));
  }
  const absl::Status all = access.Login("guess", "10.0.0.9").status();
  EXPECT_EQ(all.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(all.message()), HasSubstr("from all clients"));
  EXPECT_TRUE(access.Login("admin-token", "10.0.0.9").ok())
      << "guessers spread over many addresses do not lock the right token out";
}

}  // namespace web_api_auth_test
}  // namespace dtrain::testing
