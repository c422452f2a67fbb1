// The coordinator's HTTP JSON API (/api/v1/) against a real local cluster, read with an HTTP
// client as curl would: each route's status codes and bodies, parsed back into the protobuf
// messages the gRPC services answer (proto3 JSON mapping); incremental reads (since, offset);
// the live stream; downloads; cancel; and the token, session cookie and cross-site rules.
#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <set>
#include <tuple>
#include <vector>

#include <gmock/gmock.h>
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "common/sha256.h"
#include "coordinator/jobs/job_store.h"
#include "coordinator/web/web_access.h"
#include "dtrain/v1/cluster.pb.h"
#include "dtrain/v1/coordinator.pb.h"
#include "dtrain/v1/jobs.pb.h"
#include "dtrain/v1/workers.pb.h"
#include "tests/local_cluster.h"

namespace dtrain::testing {
namespace web_api_test {

using ::testing::HasSubstr;
using ::testing::Not;

template <typename Message>
Message Parse(const std::string& json) {
  Message out;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(json, &out).ok()) << json;
  return out;
}

// {"error": {"code": ..., "message": ...}}: the code.
std::string ErrorCode(const std::string& json) {
  google::protobuf::Struct out = Parse<google::protobuf::Struct>(json);
  if (out.fields().count("error") == 0) return "";
  return out.fields().at("error").struct_value().fields().at("code").string_value();
}

class WebApiTest : public ::testing::Test {
 protected:
  // `seed`, when given, writes into the state directory (<dir>/state) before the coordinator
  // starts on it, as an earlier run of the coordinator would have.
  void Start(const std::vector<std::string>& flags = {},
             const std::function<void(const std::string& state_dir)>& seed = nullptr) {
    cluster_ = std::make_unique<LocalCluster>(
        absl::StrCat(::testing::TempDir(), "/web-api-", getpid(), "-",
                     ::testing::UnitTest::GetInstance()->current_test_info()->name()));
    if (seed) {
      ASSERT_NO_FATAL_FAILURE(seed(cluster_->dir() + "/state"));
    }
    std::vector<std::string> all = {"--http_listen=127.0.0.1:0",
                                    "--http_port_file=" + cluster_->dir() + "/http.port"};
    all.insert(all.end(), flags.begin(), flags.end());
    ASSERT_TRUE(cluster_->StartCoordinator("127.0.0.1:0", all));
    port_ = WaitForPortFile(cluster_->dir() + "/http.port", absl::Seconds(5));
    ASSERT_GT(port_, 0);
    http_ = std::make_unique<httplib::Client>("127.0.0.1", port_);
    http_->set_read_timeout(10, 0);
  }

  std::unique_ptr<LocalCluster> cluster_;
  std::unique_ptr<httplib::Client> http_;
  int port_ = 0;
};

TEST_F(WebApiTest, Routes_StatusCodesAndProtoJson_IncrementalReads_StreamDownloadCancel) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_TRUE(cluster_->AddWorker("w0"));
  ASSERT_TRUE(cluster_->AddWorker("w1"));
  ASSERT_TRUE(WaitFor([&] { return cluster_->AliveWorkers(true) == 2; }, absl::Seconds(10)));

  auto empty = http_->Get("/api/v1/jobs");
  ASSERT_TRUE(empty);
  EXPECT_EQ(empty->status, 200);
  EXPECT_EQ(empty->get_header_value("Content-Type"), "application/json");
  EXPECT_EQ(Parse<v1::ListJobsResponse>(empty->body).total_size(), 0);

  const std::string id = cluster_->Submit("web", SyntheticDdpJob("web", 2, 1024));
  ASSERT_FALSE(id.empty());
  // The live stream sees it run and end (read until the terminal event or 60 s).
  std::string stream;
  httplib::Client sse("127.0.0.1", port_);
  sse.set_read_timeout(60, 0);
  auto streamed = sse.Get(absl::StrCat("/api/v1/events?job=", id), [&](const char* data, size_t n) {
    stream.append(data, n);
    return !absl::StrContains(stream, "\"state\":\"SUCCEEDED\"") &&
           !absl::StrContains(stream, "\"state\":\"FAILED\"");
  });
  EXPECT_THAT(stream, HasSubstr("event: job\ndata: {"));
  EXPECT_THAT(stream, HasSubstr("\"state\":\"RUNNING\""));
  EXPECT_THAT(stream, HasSubstr("\"state\":\"SUCCEEDED\""));
  ASSERT_TRUE(
      WaitFor([&] { return cluster_->GetJob(id).state() == v1::SUCCEEDED; }, absl::Seconds(60)));

  // Jobs, paged and sorted; one job with its spec.
  auto list = http_->Get("/api/v1/jobs?page_size=1&sort=name&order=asc");
  ASSERT_TRUE(list);
  ASSERT_EQ(list->status, 200) << list->body;
  const v1::ListJobsResponse page = Parse<v1::ListJobsResponse>(list->body);
  ASSERT_EQ(page.jobs_size(), 1);
  EXPECT_EQ(page.jobs(0).id(), id);
  EXPECT_EQ(page.total_size(), 1);
  EXPECT_TRUE(page.next_page_token().empty());
  auto one = http_->Get("/api/v1/jobs/" + id);
  ASSERT_TRUE(one);
  EXPECT_EQ(one->status, 200);
  const v1::JobStatus job = Parse<v1::JobStatus>(one->body);
  EXPECT_EQ(job.state(), v1::SUCCEEDED);
  EXPECT_EQ(job.spec().trainer().num_nodes(), 2) << "GetJob's spec comes along";
  EXPECT_THAT(one->body, HasSubstr("\"globalStep\":\"32\"")) << "proto3 JSON: int64 as a string";

  // Metric points from `since`, then nothing new.
  auto metrics = http_->Get(absl::StrCat("/api/v1/jobs/", id, "/metrics?since=0"));
  ASSERT_TRUE(metrics);
  ASSERT_EQ(metrics->status, 200);
  const v1::GetJobMetricsResponse points = Parse<v1::GetJobMetricsResponse>(metrics->body);
  ASSERT_GT(points.points_size(), 4);
  EXPECT_EQ(points.next_point(), points.points_size());
  std::set<std::string> names;
  for (const v1::MetricPoint& p : points.points()) names.insert(p.name());
  EXPECT_TRUE(names.count("train_loss") && names.count("val_loss") && names.count("test_acc"));
  auto later =
      http_->Get(absl::StrCat("/api/v1/jobs/", id, "/metrics?since=", points.next_point() - 1));
  ASSERT_TRUE(later);
  EXPECT_EQ(Parse<v1::GetJobMetricsResponse>(later->body).points_size(), 1);
  for (const char* bad : {"abc", "-1", "1.5"}) {
    auto refused = http_->Get(absl::StrCat("/api/v1/jobs/", id, "/metrics?since=", bad));
    ASSERT_TRUE(refused);
    EXPECT_EQ(refused->status, 400) << bad;
    EXPECT_EQ(ErrorCode(refused->body), "INVALID_ARGUMENT");
    EXPECT_THAT(refused->body, HasSubstr("'since' must be a whole number"));
  }

  // The log from an offset.
  auto logs = http_->Get(absl::StrCat("/api/v1/jobs/", id, "/logs?offset=0"));
  ASSERT_TRUE(logs);
  const v1::GetJobLogsResponse all_lines = Parse<v1::GetJobLogsResponse>(logs->body);
  ASSERT_GT(all_lines.lines_size(), 3);
  EXPECT_THAT(all_lines.lines(0), HasSubstr("submitted"));
  auto tail =
      http_->Get(absl::StrCat("/api/v1/jobs/", id, "/logs?offset=", all_lines.next_line() - 1));
  ASSERT_TRUE(tail);
  const v1::GetJobLogsResponse last_line = Parse<v1::GetJobLogsResponse>(tail->body);
  ASSERT_EQ(last_line.lines_size(), 1);
  EXPECT_THAT(last_line.lines(0), HasSubstr("job SUCCEEDED"));

  // Workers, groups, the cluster.
  auto workers = http_->Get("/api/v1/workers");
  ASSERT_TRUE(workers);
  EXPECT_EQ(Parse<v1::ListWorkersResponse>(workers->body).workers_size(), 2);
  auto groups = http_->Get("/api/v1/groups");
  ASSERT_TRUE(groups);
  EXPECT_EQ(groups->status, 200);
  Parse<v1::ListGroupsResponse>(groups->body);
  auto cluster = http_->Get("/api/v1/cluster");
  ASSERT_TRUE(cluster);
  const v1::ClusterSummary summary = Parse<v1::ClusterSummary>(cluster->body);
  EXPECT_EQ(summary.workers_size(), 2);
  EXPECT_EQ(summary.jobs_by_state().at("SUCCEEDED"), 1);

  // The last checkpoint, as the store keeps it.
  ASSERT_FALSE(job.files().empty());
  const v1::JobFile& file = job.files(0);
  auto download = http_->Get(absl::StrCat("/api/v1/jobs/", id, "/files/", file.name()));
  ASSERT_TRUE(download);
  ASSERT_EQ(download->status, 200);
  EXPECT_EQ(static_cast<int64_t>(download->body.size()), file.size_bytes());
  Sha256 hash;
  hash.Update(download->body);
  EXPECT_EQ(hash.Finish(), file.digest());
  EXPECT_THAT(download->get_header_value("Content-Disposition"), HasSubstr(file.name()));

  // Errors: unknown job, file and route; cancelling an ended job; a cross-site POST.
  for (const std::string& path : std::vector<std::string>{
           "/api/v1/jobs/nosuch-1", "/api/v1/jobs/nosuch-1/metrics", "/api/v1/jobs/nosuch-1/logs",
           "/api/v1/nothing-here", "/api/v1/jobs/" + id + "/files/nosuch.ckpt"}) {
    auto missing = http_->Get(path);
    ASSERT_TRUE(missing) << path;
    EXPECT_EQ(missing->status, 404) << path;
    EXPECT_EQ(ErrorCode(missing->body), "NOT_FOUND") << path;
  }
  auto ended = http_->Post(absl::StrCat("/api/v1/jobs/", id, "/cancel"));
  ASSERT_TRUE(ended);
  EXPECT_EQ(ended->status, 409);
  EXPECT_EQ(ErrorCode(ended->body), "FAILED_PRECONDITION");
  httplib::Headers foreign = {{"Origin", "http://evil.example"}};
  auto forged =
      http_->Post(absl::StrCat("/api/v1/jobs/", id, "/cancel"), foreign, "", "text/plain");
  ASSERT_TRUE(forged);
  EXPECT_EQ(forged->status, 403);
  EXPECT_EQ(ErrorCode(forged->body), "PERMISSION_DENIED");
  auto bad_sort = http_->Get("/api/v1/jobs?sort=color");
  ASSERT_TRUE(bad_sort);
  EXPECT_EQ(bad_sort->status, 400);

  // A running job is cancelled by POST.
  const std::string long_id = cluster_->Submit("long", SyntheticDdpJob("long", 1000, 4096));
  ASSERT_TRUE(
      WaitFor([&] { return cluster_->GetJob(long_id).state() == v1::RUNNING; }, absl::Seconds(30)));
  httplib::Headers same = {{"Origin", absl::StrCat("http://127.0.0.1:", port_)}};
  auto cancel =
      http_->Post(absl::StrCat("/api/v1/jobs/", long_id, "/cancel"), same, "", "text/plain");
  ASSERT_TRUE(cancel);
  EXPECT_EQ(cancel->status, 200) << cancel->body;
  ASSERT_TRUE(WaitFor([&] { return cluster_->GetJob(long_id).state() == v1::CANCELLED; },
                      absl::Seconds(15)));

  // The page and its files.
  auto index = http_->Get("/");
  ASSERT_TRUE(index);
  EXPECT_EQ(index->status, 200);
  EXPECT_THAT(index->body, HasSubstr("/static/app.js"));
  auto chart = http_->Get("/static/chart.js");
  ASSERT_TRUE(chart);
  EXPECT_THAT(chart->body, HasSubstr("Chart.js v3")) << "Debian's libjs-chart.js, embedded";
}

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

// A thousand jobs in the history: every list is a page, the summary counts them all, and the
// stream starts with what runs only. (Times are printed, not asserted: bench/ measures.)
TEST_F(WebApiTest, AThousandJobs_PagedNeverWhole) {
  ASSERT_NO_FATAL_FAILURE(Start());
  v1::SubmitJobRequest submit;
  submit.mutable_spec()->set_name("bulk");
  submit.mutable_spec()->mutable_model()->set_builtin("mlp");
  submit.mutable_spec()->mutable_data()->mutable_synthetic()->set_train_size(64);
  for (int i = 0; i < 1000; ++i) {
    grpc::ClientContext context;
    v1::SubmitJobResponse response;
    ASSERT_TRUE(cluster_->jobs().SubmitJob(&context, submit, &response).ok()) << i;
  }
  const absl::Time start = absl::Now();
  auto first = http_->Get("/api/v1/jobs");
  const absl::Duration took = absl::Now() - start;
  ASSERT_TRUE(first);
  const v1::ListJobsResponse page = Parse<v1::ListJobsResponse>(first->body);
  EXPECT_EQ(page.jobs_size(), 50);
  EXPECT_EQ(page.total_size(), 1000);
  EXPECT_EQ(page.next_page_token(), "50");
  EXPECT_EQ(page.jobs(0).id(), "bulk-1000") << "newest first";
  auto last = http_->Get("/api/v1/jobs?page_size=500&page_token=500&order=asc");
  ASSERT_TRUE(last);
  const v1::ListJobsResponse tail = Parse<v1::ListJobsResponse>(last->body);
  EXPECT_EQ(tail.jobs_size(), 500);
  EXPECT_EQ(tail.jobs(499).id(), "bulk-1000");
  EXPECT_TRUE(tail.next_page_token().empty());
  auto beyond = http_->Get("/api/v1/jobs?page_token=9223372036854775807");
  ASSERT_TRUE(beyond);
  EXPECT_EQ(beyond->status, 200);
  EXPECT_EQ(Parse<v1::ListJobsResponse>(beyond->body).jobs_size(), 0) << "past the end: empty";
  auto capped = http_->Get("/api/v1/jobs?page_size=100000");
  ASSERT_TRUE(capped);
  EXPECT_EQ(Parse<v1::ListJobsResponse>(capped->body).jobs_size(), 500) << "at most 500 a page";
  auto summary = http_->Get("/api/v1/cluster");
  ASSERT_TRUE(summary);
  EXPECT_EQ(Parse<v1::ClusterSummary>(summary->body).jobs_by_state().at("QUEUED"), 1000);
  std::printf("GET /api/v1/jobs with 1000 jobs: %.1f ms, %zu bytes\n",
              absl::ToDoubleMilliseconds(took), first->body.size());
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

// A raw connection to the dashboard: `request` sent, and what comes back until `until` is in it,
// or the server closes, or 5 s pass.
struct RawHttp {
  explicit RawHttp(int port) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(static_cast<uint16_t>(port));
    ::inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
    connected = ::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) == 0;
  }
  ~RawHttp() { ::close(fd); }
  std::string Exchange(const std::string& request, const std::string& until) {
    (void)::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
    std::string out;
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    char buffer[4096];
    while (!absl::StrContains(out, until) && absl::Now() < deadline) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
      if (n <= 0) break;
      out.append(buffer, static_cast<size_t>(n));
    }
    return out;
  }
  int fd = -1;
  bool connected = false;
};

// DNS rebinding and cross-site requests (issue 38): a request naming a host not allowed is
// refused before anything else, and an Origin is compared with the allowed hosts on the port
// the request came to, not with the request's own Host.
TEST_F(WebApiTest, HostAndOrigin_CheckedAgainstTheAllowedHosts) {
  ASSERT_NO_FATAL_FAILURE(Start());
  auto rebound = http_->Get("/api/v1/jobs", {{"Host", absl::StrCat("evil.example:", port_)}});
  ASSERT_TRUE(rebound);
  EXPECT_EQ(rebound->status, 403);
  EXPECT_EQ(ErrorCode(rebound->body), "PERMISSION_DENIED");
  EXPECT_THAT(rebound->body, HasSubstr("does not answer for host 'evil.example'"));
  EXPECT_THAT(rebound->body, HasSubstr("--http_allowed_hosts"));
  auto page = http_->Get("/", {{"Host", "evil.example"}});
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 403) << "the page too, not only the API";
  auto local = http_->Get("/api/v1/jobs", {{"Host", absl::StrCat("localhost:", port_)}});
  ASSERT_TRUE(local);
  EXPECT_EQ(local->status, 200);

  const std::string cancel = "/api/v1/jobs/nosuch-1/cancel";
  auto post = [&](const std::string& origin) {
    auto r = http_->Post(cancel, {{"Origin", origin}}, "", "text/plain");
    return r ? r->status : -1;
  };
  // An allowed name on this port passes (the job is then not found); another port of the same
  // machine, or another name, is another origin.
  EXPECT_EQ(post(absl::StrCat("http://127.0.0.1:", port_)), 404);
  EXPECT_EQ(post(absl::StrCat("http://localhost:", port_)), 403)
      << "another allowed name than the request's Host is another site";
  EXPECT_EQ(post(absl::StrCat("http://localhost:", port_ == 8080 ? 8081 : 8080)), 403);
  EXPECT_EQ(post(absl::StrCat("http://evil.example:", port_)), 403);
  EXPECT_EQ(post("null"), 403);
}

TEST_F(WebApiTest, AllowedHostsFlag_ReplacesTheDefaults) {
  ASSERT_NO_FATAL_FAILURE(Start({"--http_allowed_hosts=dtrain.example,Other.Example"}));
  auto named = http_->Get("/api/v1/jobs", {{"Host", absl::StrCat("dtrain.example:", port_)}});
  ASSERT_TRUE(named);
  EXPECT_EQ(named->status, 200);
  auto other = http_->Get("/api/v1/jobs", {{"Host", "other.example"}});
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 200) << "names compare case-insensitively";
  auto loopback = http_->Get("/api/v1/jobs");
  ASSERT_TRUE(loopback);
  EXPECT_EQ(loopback->status, 403) << "127.0.0.1 is not in the list given";
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

// Live event streams each hold a server thread: a client may keep four open, and one that
// goes away gives its place back within a second.
TEST_F(WebApiTest, EventStreams_CappedPerClient_PlaceBackWhenOneCloses) {
  ASSERT_NO_FATAL_FAILURE(Start());
  const std::string request =
      absl::StrCat("GET /api/v1/events HTTP/1.1\r\nHost: 127.0.0.1:", port_, "\r\n\r\n");
  std::vector<std::unique_ptr<RawHttp>> streams;
  for (int i = 0; i < 4; ++i) {
    streams.push_back(std::make_unique<RawHttp>(port_));
    ASSERT_TRUE(streams.back()->connected);
    EXPECT_THAT(streams.back()->Exchange(request, "\r\n\r\n"), HasSubstr("HTTP/1.1 200 OK"));
  }
  RawHttp fifth(port_);
  const std::string refused = fifth.Exchange(request, "}}");
  EXPECT_THAT(refused, HasSubstr("HTTP/1.1 429"));
  EXPECT_THAT(refused, HasSubstr("has 4 live event streams open, the limit per client"));
  streams.pop_back();
  bool reopened = false;
  for (int i = 0; i < 30 && !reopened; ++i) {
    RawHttp again(port_);
    reopened = absl::StrContains(again.Exchange(request, "\r\n\r\n"), "HTTP/1.1 200 OK");
    if (!reopened) absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_TRUE(reopened);
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

// What docs/dashboard.md promises of the job list, on jobs a coordinator ran before (written to
// its state as it would have, then restored): every sort key in both directions, each key's
// values distinct so each order is the one only that key gives, and the state= filter.
struct SeededJob {
  std::string id, name;
  v1::JobState state;
  int64_t step;
  double samples_per_second;
};
const std::vector<SeededJob>& SeededJobs() {
  // In submission order. Orders ascending: name 3 5 1 2 4, id 3 5 2 1 4 ("run-2-1" < "run-3"),
  // state 3 2 {4 5} 1, step 4 1 3 2 5, samples/s 3 1 5 4 2.
  static const std::vector<SeededJob> jobs = {
      {"run-3", "run", v1::CANCELLED, 20, 2.5},  {"run-2-1", "run-2", v1::SUCCEEDED, 40, 7.5},
      {"eval-1", "eval", v1::QUEUED, 30, 1.0},   {"sweep-1", "sweep", v1::FAILED, 10, 5.0},
      {"probe-1", "probe", v1::FAILED, 50, 3.5},
  };
  return jobs;
}

// The seeded jobs into <state_dir>/coordinator.db; the SUCCEEDED one with `points` metric
// points and a job.log of `lines` lines.
void SeedJobs(const std::string& state_dir, int points, int lines) {
  std::filesystem::create_directories(state_dir);
  auto store = JobStore::Open(state_dir + "/coordinator.db");
  ASSERT_TRUE(store.ok()) << store.status();
  int64_t submitted = 1767225600000;  // 2026-01-01
  for (const SeededJob& j : SeededJobs()) {
    v1::JobSpec spec;
    spec.set_name(j.name);
    spec.mutable_model()->set_builtin("mlp");
    spec.mutable_data()->mutable_synthetic()->set_train_size(64);
    v1::JobStatus status;
    status.set_id(j.id);
    status.set_name(j.name);
    status.set_state(j.state);
    status.set_submitted_unix_ms(submitted += 1000);
    if (IsTerminal(j.state)) status.set_finished_unix_ms(submitted + 500);
    status.mutable_progress()->set_global_step(j.step);
    status.mutable_progress()->set_samples_per_second(j.samples_per_second);
    ASSERT_TRUE((*store)->Insert(spec, status).ok());
    if (j.state != v1::SUCCEEDED) continue;
    for (int i = 0; i < points; ++i) {
      v1::MetricPoint point;
      point.set_name("train_loss");
      point.set_step(i);
      point.set_value(1.0 / (i + 1));
      ASSERT_TRUE((*store)->AddMetric(j.id, point).ok());
    }
    const std::string dir = absl::StrCat(state_dir, "/jobs/", j.id);
    std::filesystem::create_directories(dir);
    std::ofstream log(dir + "/job.log");
    for (int i = 0; i < lines; ++i) log << "2026-01-01 00:00:00 line " << i << "\n";
  }
}

TEST_F(WebApiTest, JobsList_EverySortKeyBothWays_StateFilter) {
  ASSERT_NO_FATAL_FAILURE(Start({}, [](const std::string& state) { SeedJobs(state, 0, 0); }));
  const std::vector<SeededJob>& seeded = SeededJobs();
  // What the coordinator restored, by id: the values the orders must follow.
  std::map<std::string, v1::JobStatus> restored;
  for (const SeededJob& j : seeded) {
    auto got = http_->Get("/api/v1/jobs/" + j.id);
    ASSERT_TRUE(got && got->status == 200) << j.id;
    restored[j.id] = Parse<v1::JobStatus>(got->body);
    EXPECT_EQ(restored[j.id].state(), j.state) << j.id;
    EXPECT_EQ(restored[j.id].progress().global_step(), j.step) << j.id;
  }
  using Less = std::function<bool(const v1::JobStatus&, const v1::JobStatus&)>;
  const std::vector<std::pair<std::string, Less>> keys = {
      {"id", [](const auto& a, const auto& b) { return a.id() < b.id(); }},
      {"name", [](const auto& a, const auto& b) { return a.name() < b.name(); }},
      {"state", [](const auto& a, const auto& b) { return a.state() < b.state(); }},
      {"step",
       [](const auto& a, const auto& b) {
         return a.progress().global_step() < b.progress().global_step();
       }},
      {"samples_per_second",
       [](const auto& a, const auto& b) {
         return a.progress().samples_per_second() < b.progress().samples_per_second();
       }},
  };
  auto listed = [&](const std::string& query) {
    std::vector<std::string> ids;
    auto got = http_->Get("/api/v1/jobs?" + query);
    EXPECT_TRUE(got && got->status == 200) << query;
    if (!got) return ids;
    const v1::ListJobsResponse page = Parse<v1::ListJobsResponse>(got->body);
    EXPECT_EQ(page.total_size(), page.jobs_size()) << query;
    for (const v1::JobStatus& j : page.jobs()) ids.push_back(j.id());
    return ids;
  };
  std::vector<std::string> submitted;
  for (const SeededJob& j : seeded) submitted.push_back(j.id);
  EXPECT_EQ(listed("sort=submitted&order=asc"), submitted);
  EXPECT_EQ(listed(""), std::vector<std::string>(submitted.rbegin(), submitted.rend()))
      << "newest first by default";
  std::set<std::vector<std::string>> orders = {submitted};
  for (const auto& [key, less] : keys) {
    for (const std::string order : {"asc", "desc"}) {
      SCOPED_TRACE(key + " " + order);
      const std::vector<std::string> ids = listed("sort=" + key + "&order=" + order);
      ASSERT_EQ(ids.size(), seeded.size());
      // Each neighbouring pair in order, and only ties (two FAILED jobs by state) in either.
      for (size_t i = 0; i + 1 < ids.size(); ++i) {
        const v1::JobStatus& a = restored[ids[i]];
        const v1::JobStatus& b = restored[ids[i + 1]];
        EXPECT_FALSE(order == "asc" ? less(b, a) : less(a, b))
            << ids[i] << " before " << ids[i + 1];
        if (key != "state") {
          EXPECT_TRUE(less(a, b) || less(b, a)) << "a tie: " << ids[i];
        }
      }
      if (order == "asc") orders.insert(ids);
    }
  }
  // The data tells the keys apart: six different orders (a sort that ignored its key fails).
  EXPECT_EQ(orders.size(), keys.size() + 1);
  EXPECT_EQ(listed("sort=step&order=asc"),
            (std::vector<std::string>{"sweep-1", "run-3", "eval-1", "run-2-1", "probe-1"}));

  // state=: exactly the jobs in that state, sorted as asked.
  EXPECT_EQ(listed("state=FAILED&sort=step&order=desc"),
            (std::vector<std::string>{"probe-1", "sweep-1"}));
  EXPECT_EQ(listed("state=QUEUED"), (std::vector<std::string>{"eval-1"}));
  EXPECT_EQ(listed("state=RUNNING"), std::vector<std::string>());
  auto bad = http_->Get("/api/v1/jobs?state=DONE");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  EXPECT_THAT(bad->body, HasSubstr("state 'DONE' is not QUEUED, RUNNING"));
  auto bad_order = http_->Get("/api/v1/jobs?order=up");
  ASSERT_TRUE(bad_order);
  EXPECT_EQ(bad_order->status, 400);
}

// One answer holds at most 10,000 metric points and 2,000 log lines (docs/dashboard.md); the
// rest comes from since / offset, and `truncated` says there is more.
TEST_F(WebApiTest, MetricsAndLogs_CappedPerAnswer_RestFromSinceAndOffset) {
  ASSERT_NO_FATAL_FAILURE(
      Start({}, [](const std::string& state) { SeedJobs(state, 10050, 2050); }));
  auto first = http_->Get("/api/v1/jobs/run-2-1/metrics?since=0");
  ASSERT_TRUE(first && first->status == 200);
  const v1::GetJobMetricsResponse points = Parse<v1::GetJobMetricsResponse>(first->body);
  EXPECT_EQ(points.points_size(), 10000);
  EXPECT_EQ(points.next_point(), 10000);
  EXPECT_TRUE(points.truncated());
  EXPECT_EQ(points.points(9999).step(), 9999);
  auto rest = http_->Get("/api/v1/jobs/run-2-1/metrics?since=10000");
  ASSERT_TRUE(rest && rest->status == 200);
  const v1::GetJobMetricsResponse more = Parse<v1::GetJobMetricsResponse>(rest->body);
  EXPECT_EQ(more.points_size(), 50);
  EXPECT_EQ(more.points(0).step(), 10000);
  EXPECT_EQ(more.next_point(), 10050);
  EXPECT_FALSE(more.truncated());

  auto head = http_->Get("/api/v1/jobs/run-2-1/logs?offset=0");
  ASSERT_TRUE(head && head->status == 200);
  const v1::GetJobLogsResponse lines = Parse<v1::GetJobLogsResponse>(head->body);
  EXPECT_EQ(lines.lines_size(), 2000);
  EXPECT_EQ(lines.next_line(), 2000);
  EXPECT_TRUE(lines.truncated());
  EXPECT_THAT(lines.lines(1999), HasSubstr(" line 1999"));
  auto tail = http_->Get("/api/v1/jobs/run-2-1/logs?offset=2000");
  ASSERT_TRUE(tail && tail->status == 200);
  const v1::GetJobLogsResponse last = Parse<v1::GetJobLogsResponse>(tail->body);
  EXPECT_EQ(last.lines_size(), 50);
  EXPECT_THAT(last.lines(0), HasSubstr(" line 2000"));
  EXPECT_EQ(last.next_line(), 2050);
  EXPECT_FALSE(last.truncated());
}

// Every answer (pages, scripts, the API, errors, the login page) carries the Content-Security-
// Policy that allows scripts from the coordinator only, and the other headers beside it.
TEST_F(WebApiTest, EveryAnswer_CarriesTheContentSecurityPolicy) {
  const std::string token_file = TestTempPath("token");
  std::ofstream(token_file) << "csp-admin-token\n";
  ASSERT_NO_FATAL_FAILURE(Start({"--token_file=" + token_file}));
  const httplib::Headers admin = {{"Authorization", "Bearer csp-admin-token"}};
  for (const auto& [path, headers, status] :
       std::vector<std::tuple<std::string, httplib::Headers, int>>{
           {"/", admin, 200},
           {"/", {}, 401},  // the login page
           {"/login", {}, 200},
           {"/static/app.js", admin, 200},
           {"/static/login.js", {}, 200},
           {"/api/v1/jobs", admin, 200},
           {"/api/v1/jobs", {}, 401},
           {"/api/v1/jobs/nosuch-1", admin, 404}}) {
    SCOPED_TRACE(path);
    auto got = http_->Get(path, headers);
    ASSERT_TRUE(got);
    EXPECT_EQ(got->status, status);
    EXPECT_EQ(got->get_header_value("Content-Security-Policy"),
              "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
              "frame-ancestors 'none'");
    EXPECT_EQ(got->get_header_value("X-Content-Type-Options"), "nosniff");
  }
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

// The attacks of issue 38 on a real coordinator's dashboard, before any login: a 256 MiB header,
// a request line without end, a declared 64 MiB body, 200 connections from one client. Each
// gets its answer or is cut off, the API keeps answering, and the coordinator's memory stays
// flat (the numbers go to docs/RELIABILITY.md).
TEST_F(WebApiTest, HostileClients_Answered_OthersServed_CoordinatorMemoryFlat) {
  const std::string token_file = ::testing::TempDir() + "/web-hostile-" + std::to_string(getpid());
  std::ofstream(token_file) << "web-admin-token-789\n";
  ASSERT_NO_FATAL_FAILURE(Start({"--token_file=" + token_file}));
  const httplib::Headers admin = {{"Authorization", "Bearer web-admin-token-789"}};
  auto served = [&] {
    auto r = http_->Get("/api/v1/jobs", admin);
    return r && r->status == 200;
  };
  ASSERT_TRUE(served());
  const pid_t coordinator = cluster_->coordinator_pid();
  const long before = ResidentKiB(coordinator);

  int64_t flood_sent = 0;
  {
    RawHttp flood(port_);
    (void)::send(flood.fd, "GET /api/v1/jobs HTTP/1.1\r\nX-Flood: ", 36, MSG_NOSIGNAL);
    const std::string chunk(1 << 20, 'f');
    for (int i = 0; i < 256; ++i) {
      if (::send(flood.fd, chunk.data(), chunk.size(), MSG_NOSIGNAL) !=
          static_cast<ssize_t>(chunk.size()))
        break;
      flood_sent += static_cast<int64_t>(chunk.size());
    }
  }
  EXPECT_LT(flood_sent, int64_t{64} << 20) << "the coordinator kept reading a 256 MiB header";
  {
    RawHttp line(port_);
    EXPECT_THAT(line.Exchange("GET /" + std::string(100 << 10, 'l'), "}}"),
                HasSubstr("HTTP/1.1 431"));
  }
  {
    RawHttp body(port_);
    EXPECT_THAT(body.Exchange(absl::StrCat("POST /login HTTP/1.1\r\nHost: 127.0.0.1:", port_,
                                           "\r\nContent-Type: application/json\r\n"
                                           "Content-Length: 67108864\r\n\r\n{"),
                              "\r\n\r\n"),
                HasSubstr("HTTP/1.1 413"));
  }
  {
    std::vector<std::unique_ptr<RawHttp>> many;
    for (int i = 0; i < 200; ++i) many.push_back(std::make_unique<RawHttp>(port_));
    absl::SleepFor(absl::Milliseconds(300));
    RawHttp one_more(port_);
    const std::string answer = one_more.Exchange("", "}}");
    EXPECT_THAT(answer, ::testing::AnyOf(HasSubstr("HTTP/1.1 429"), HasSubstr("HTTP/1.1 503")));
  }
  bool again = false;
  for (int i = 0; i < 50 && !again; ++i) {
    again = served();
    if (!again) absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_TRUE(again) << "the API answers again once the attackers are gone";
  const long after = ResidentKiB(coordinator);
  std::cout << "coordinator RSS " << before << " KiB before the attacks, " << after
            << " KiB after; the flood was cut after " << (flood_sent >> 10) << " KiB\n";
  EXPECT_LT(after - before, 32 << 10);
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

}  // namespace web_api_test
}  // namespace dtrain::testing
