#include "coordinator/web/web_server.h"

#include <httplib.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/bounded_http_server.h"
#include "common/file_reference.h"
#include "common/http_port_alone.h"
#include "common/job_spec.h"
#include "coordinator/web/dashboard_assets.h"
#include "coordinator/web/web_access.h"
#include "dtrain/v1/cluster.pb.h"
#include "dtrain/v1/coordinator.pb.h"
#include "dtrain/v1/jobs.pb.h"
#include "dtrain/v1/workers.pb.h"

namespace dtrain {
namespace {

// Bounds of one answer: pages of jobs, points and lines, so no list grows without limit.
constexpr int kDefaultPageSize = 50;
constexpr int kMaxPageSize = 500;
constexpr int kMaxPoints = 10000;
constexpr int kMaxLines = 2000;

// Live event streams hold a server thread each (HttpLimits::threads, 64): at most this many at
// once, and per client address, so that API calls always find a thread.
constexpr int kMaxEventStreams = 16;
constexpr int kMaxEventStreamsPerClient = 4;

// The names a request may give in Host when --http_allowed_hosts is not set.
std::vector<std::string> DefaultAllowedHosts(const std::string& listen_host,
                                             const std::string& advertised_host) {
  std::vector<std::string> hosts = {"localhost", "127.0.0.1", "::1"};
  if (!advertised_host.empty()) hosts.push_back(advertised_host);
  if (!listen_host.empty() && listen_host != "0.0.0.0" && listen_host != "[::]" &&
      listen_host != "::") {
    hosts.push_back(listen_host);
  }
  char name[256] = {0};
  if (gethostname(name, sizeof(name) - 1) == 0 && name[0] != '\0') hosts.push_back(name);
  return hosts;
}

std::string Json(const google::protobuf::Message& message) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.always_print_primitive_fields = true;
  (void)google::protobuf::util::MessageToJsonString(message, &out, options);
  return out;
}

int HttpStatus(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kAborted:
      return 409;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

// {"error": {"code": "NOT_FOUND", "message": "..."}}, as the CLI's --output json errors.
void Error(httplib::Response& response, const absl::Status& status) {
  response.status = HttpStatus(status.code());
  google::protobuf::Struct out;
  auto& error = *(*out.mutable_fields())["error"].mutable_struct_value()->mutable_fields();
  error["code"].set_string_value(absl::StatusCodeToString(status.code()));
  error["message"].set_string_value(std::string(status.message()));
  response.set_content(Json(out), "application/json");
}

void Reply(httplib::Response& response, const google::protobuf::Message& message) {
  response.set_content(Json(message), "application/json");
}

// A non-negative integer query parameter; `fallback` when absent.
absl::StatusOr<int64_t> IntParam(const httplib::Request& request, const char* name,
                                 int64_t fallback) {
  if (!request.has_param(name)) return fallback;
  const std::string text = request.get_param_value(name);
  int64_t value = 0;
  if (!absl::SimpleAtoi(text, &value) || value < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", name, "' must be a whole number >= 0, got '", text, "'"));
  }
  return value;
}

// The order of the jobs table: a key of JobStatus and a direction.
absl::Status SortJobs(std::vector<v1::JobStatus>* jobs, const std::string& by, bool descending) {
  if (by == "submitted") {
    // The list is in submission order already (jobs submitted within one millisecond too).
    if (descending) std::reverse(jobs->begin(), jobs->end());
    return absl::OkStatus();
  }
  using Key = std::function<bool(const v1::JobStatus&, const v1::JobStatus&)>;
  static const std::map<std::string, Key> kKeys = {
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
  auto it = kKeys.find(by);
  if (it == kKeys.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sort '", by, "' is not one of submitted, id, name, state, step, samples_per_second"));
  }
  const Key& less = it->second;
  std::stable_sort(jobs->begin(), jobs->end(), [&](const auto& a, const auto& b) {
    return descending ? less(b, a) : less(a, b);
  });
  return absl::OkStatus();
}

// Open live event streams, in total and per client address.
class EventStreams {
 public:
  absl::Status Open(const std::string& client) {
    std::lock_guard<std::mutex> lock(mu_);
    if (total_ >= kMaxEventStreams) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "this coordinator serves ", kMaxEventStreams,
          " live event streams at once, its limit; close a dashboard tab or poll /api/v1/jobs"));
    }
    int& mine = per_client_[client];
    if (mine >= kMaxEventStreamsPerClient) {
      return absl::ResourceExhaustedError(
          absl::StrCat(client, " has ", kMaxEventStreamsPerClient,
                       " live event streams open, the limit per client; close one first"));
    }
    ++mine;
    ++total_;
    return absl::OkStatus();
  }
  void Close(const std::string& client) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = per_client_.find(client);
    if (it == per_client_.end()) return;
    if (--it->second <= 0) per_client_.erase(it);
    --total_;
  }

 private:
  std::mutex mu_;
  int total_ = 0;
  std::map<std::string, int> per_client_;
};

bool IsPage(const std::string& path) {
  return path == "/" || path == "/index.html" || path == "/login";
}

}  // namespace

absl::StatusOr<std::unique_ptr<WebServer>> WebServer::Start(WebServerOptions options,
                                                            WebSources sources) {
  const size_t colon = options.listen.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(options.listen.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--http_listen '", options.listen, "' is not host:port"));
  }
  const bool https = !options.tls.cert.empty() && !options.tls.key.empty();
  if (!IsLoopbackAddress(options.listen) && options.admin_token.empty() && !options.insecure) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--http_listen ", options.listen,
        " is beyond loopback and the coordinator has no admin token: anyone reaching it could "
        "cancel jobs; set --token_file, or --insecure on a network you trust"));
  }
  if (!IsLoopbackAddress(options.listen) && !options.admin_token.empty() && !https &&
      !options.insecure) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--http_listen ", options.listen,
        " is beyond loopback with an admin token but without TLS: the token and session cookies "
        "would cross the network in clear; set --tls_cert and --tls_key, or --insecure on a "
        "network you trust"));
  }
  std::unique_ptr<WebServer> server(new WebServer());
  server->options_ = std::move(options);
  server->sources_ = sources;
  server->access_ = std::make_unique<WebAccess>(server->options_.admin_token, https);
  const std::string host = server->options_.listen.substr(0, colon);
  server->access_->AllowHosts(server->options_.allowed_hosts.empty()
                                  ? DefaultAllowedHosts(host, server->options_.advertised_host)
                                  : server->options_.allowed_hosts);
  HttpLimits limits;
  absl::StatusOr<std::unique_ptr<httplib::Server>> bounded =
      https ? NewBoundedHttpServer(limits, server->options_.tls.cert, server->options_.tls.key)
            : NewBoundedHttpServer(limits);
  if (!bounded.ok()) return bounded.status();
  server->server_ = *std::move(bounded);
  BindPortAlone(*server->server_);
  server->AddRoutes();
  server->port_ = port == 0 ? server->server_->bind_to_any_port(host.c_str())
                            : (server->server_->bind_to_port(host.c_str(), port) ? port : -1);
  if (server->port_ <= 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", server->options_.listen, " for the dashboard"));
  }
  server->url_ =
      absl::StrCat(https ? "https://" : "http://",
                   host.empty() || host == "0.0.0.0" ? "127.0.0.1" : host, ":", server->port_, "/");
  httplib::Server* raw = server->server_.get();
  server->thread_ = std::thread([raw] { raw->listen_after_bind(); });
  return server;
}

WebServer::~WebServer() {
  stopping_->store(true);
  if (server_ != nullptr) server_->stop();
  if (thread_.joinable()) thread_.join();
}

void WebServer::AddRoutes() {
  httplib::Server& s = *server_;
  WebAccess* access = access_.get();
  JobManager* jobs = sources_.jobs;
  WorkerRegistry* workers = sources_.workers;
  const GroupTable* groups = sources_.groups;
  ArtifactStore* artifacts = sources_.artifacts;
  std::shared_ptr<std::atomic<bool>> stopping = stopping_;

  // Every request is checked here first: the login page and its POST, and the static files it
  // needs, are the only ones open without credentials.
  s.set_pre_routing_handler([access](const httplib::Request& request, httplib::Response& response) {
    response.set_header("X-Content-Type-Options", "nosniff");
    response.set_header("Referrer-Policy", "same-origin");
    response.set_header("Content-Security-Policy",
                        "default-src 'self'; img-src 'self' data:; style-src 'self'; "
                        "script-src 'self'; frame-ancestors 'none'");
    const bool open = request.path == "/login" || request.path == "/static/app.css" ||
                      request.path == "/static/login.js";
    if (absl::Status host = access->CheckHost(request.get_header_value("Host")); !host.ok()) {
      Error(response, host);
      return httplib::Server::HandlerResponse::Handled;
    }
    if (request.method == "POST") {
      absl::Status same = access->CheckSameOrigin(request.get_header_value("Origin"),
                                                  request.get_header_value("Host"));
      if (!same.ok()) {
        Error(response, same);
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    if (open) return httplib::Server::HandlerResponse::Unhandled;
    absl::Status allowed = access->Check(request.get_header_value("Authorization"),
                                         request.get_header_value("Cookie"));
    if (allowed.ok()) return httplib::Server::HandlerResponse::Unhandled;
    if (IsPage(request.path) && request.method == "GET") {
      // A person at a browser: the login page, which asks for the token once.
      response.status = 401;
      response.set_content(DashboardAsset("login.html"), "text/html; charset=utf-8");
    } else {
      Error(response, allowed);
    }
    return httplib::Server::HandlerResponse::Handled;
  });

  // The dashboard: one page, its script and style, and Chart.js from Debian's libjs-chart.js.
  for (const char* name : {"app.js", "app.css", "chart.js", "login.js"}) {
    s.Get(absl::StrCat("/static/", name), [name](const httplib::Request&, httplib::Response& r) {
      const std::string type = absl::EndsWith(name, ".css") ? "text/css; charset=utf-8"
                                                            : "text/javascript; charset=utf-8";
      r.set_header("Cache-Control", "no-cache");
      r.set_content(DashboardAsset(name), type);
    });
  }
  auto page = [](const httplib::Request&, httplib::Response& r) {
    r.set_content(DashboardAsset("index.html"), "text/html; charset=utf-8");
  };
  s.Get("/", page);
  s.Get("/index.html", page);
  s.Get("/login", [](const httplib::Request&, httplib::Response& r) {
    r.set_content(DashboardAsset("login.html"), "text/html; charset=utf-8");
  });
  s.Post("/login", [access](const httplib::Request& request, httplib::Response& response) {
    absl::StatusOr<std::string> cookie = access->LoginWithBody(request.body, request.remote_addr);
    if (!cookie.ok()) return Error(response, cookie.status());
    response.set_header("Set-Cookie", *cookie);
    response.set_content("{}", "application/json");
  });
  s.Post("/logout", [access](const httplib::Request& request, httplib::Response& response) {
    response.set_header("Set-Cookie", access->Logout(request.get_header_value("Cookie")));
    response.set_content("{}", "application/json");
  });

  // GET /api/v1/jobs?page_size=50&page_token=0&sort=submitted&order=desc&state=RUNNING
  s.Get("/api/v1/jobs", [jobs](const httplib::Request& request, httplib::Response& response) {
    absl::StatusOr<int64_t> size = IntParam(request, "page_size", kDefaultPageSize);
    absl::StatusOr<int64_t> first = IntParam(request, "page_token", 0);
    if (!size.ok()) return Error(response, size.status());
    if (!first.ok()) return Error(response, first.status());
    const int64_t page =
        std::clamp<int64_t>(*size == 0 ? kDefaultPageSize : *size, 1, kMaxPageSize);
    v1::JobState state = v1::QUEUED;
    const bool filtered = request.has_param("state");
    if (filtered && !v1::JobState_Parse(request.get_param_value("state"), &state)) {
      return Error(response, absl::InvalidArgumentError(absl::StrCat(
                                 "state '", request.get_param_value("state"),
                                 "' is not QUEUED, RUNNING, SUCCEEDED, FAILED or CANCELLED")));
    }
    const std::string order =
        request.has_param("order") ? request.get_param_value("order") : "desc";
    if (order != "asc" && order != "desc") {
      return Error(response, absl::InvalidArgumentError(
                                 absl::StrCat("order '", order, "' is not asc or desc")));
    }
    const std::string by =
        request.has_param("sort") ? request.get_param_value("sort") : "submitted";
    v1::ListJobsResponse out;
    if (by == "submitted" && !filtered) {
      // The page's default view, in the manager's own order: only the page is copied, not the
      // whole history.
      size_t total = 0;
      const size_t begin = static_cast<size_t>(std::max<int64_t>(*first, 0));
      for (v1::JobStatus& job :
           jobs->List(begin, static_cast<size_t>(page), order == "desc", &total)) {
        *out.add_jobs() = std::move(job);
      }
      out.set_total_size(static_cast<int32_t>(total));
      const size_t end = std::min(total, begin + static_cast<size_t>(out.jobs_size()));
      if (end < total) out.set_next_page_token(absl::StrCat(end));
      return Reply(response, out);
    }
    // Another order sorts the whole history; a state filter copies only that state's jobs.
    std::vector<v1::JobStatus> all =
        filtered ? jobs->ListWhere([&](const std::string&, v1::JobState s) { return s == state; })
                 : jobs->List();
    // A job may have changed state between the look and the copy.
    if (filtered) {
      all.erase(std::remove_if(all.begin(), all.end(),
                               [&](const v1::JobStatus& j) { return j.state() != state; }),
                all.end());
    }
    absl::Status sorted = SortJobs(&all, by, order == "desc");
    if (!sorted.ok()) return Error(response, sorted);
    const int64_t total = static_cast<int64_t>(all.size());
    out.set_total_size(static_cast<int32_t>(total));
    // A token past the end (any number a client sends) is an empty last page.
    const int64_t begin = std::min(*first, total);
    const int64_t end = std::min(total, begin + page);
    for (int64_t i = begin; i < end; ++i) *out.add_jobs() = std::move(all[static_cast<size_t>(i)]);
    if (end < total) out.set_next_page_token(absl::StrCat(end));
    Reply(response, out);
  });

  s.Get(R"(/api/v1/jobs/([^/]+))",
        [jobs](const httplib::Request& request, httplib::Response& response) {
          absl::StatusOr<v1::JobStatus> job = jobs->Get(request.matches[1], /*with_spec=*/true);
          if (!job.ok()) return Error(response, job.status());
          Reply(response, *job);
        });

  // The points from index `since` on (0: all), at most kMaxPoints: next_point is the next since.
  s.Get(R"(/api/v1/jobs/([^/]+)/metrics)",
        [jobs](const httplib::Request& request, httplib::Response& response) {
          absl::StatusOr<int64_t> since = IntParam(request, "since", 0);
          if (!since.ok()) return Error(response, since.status());
          absl::StatusOr<std::vector<v1::MetricPoint>> points = jobs->Metrics(request.matches[1]);
          if (!points.ok()) return Error(response, points.status());
          v1::GetJobMetricsResponse out;
          int64_t i = std::min<int64_t>(*since, static_cast<int64_t>(points->size()));
          for (; i < static_cast<int64_t>(points->size()) && out.points_size() < kMaxPoints; ++i) {
            *out.add_points() = (*points)[static_cast<size_t>(i)];
          }
          out.set_next_point(i);
          out.set_truncated(i < static_cast<int64_t>(points->size()));
          Reply(response, out);
        });

  // The log from line `offset` on, at most kMaxLines: next_line is the next offset.
  s.Get(R"(/api/v1/jobs/([^/]+)/logs)", [jobs](const httplib::Request& request,
                                               httplib::Response& response) {
    absl::StatusOr<int64_t> offset = IntParam(request, "offset", 0);
    if (!offset.ok()) return Error(response, offset.status());
    int64_t next = 0;
    absl::StatusOr<std::vector<std::string>> lines = jobs->Logs(request.matches[1], *offset, &next);
    if (!lines.ok()) return Error(response, lines.status());
    v1::GetJobLogsResponse out;
    int64_t taken = 0;
    for (std::string& line : *lines) {
      if (taken == kMaxLines) break;
      out.add_lines(std::move(line));
      ++taken;
    }
    out.set_next_line(*offset + taken);
    out.set_truncated(taken < static_cast<int64_t>(lines->size()));
    Reply(response, out);
  });

  // A kept file (a checkpoint, predictions.csv), streamed from the store.
  s.Get(R"(/api/v1/jobs/([^/]+)/files/([^/]+))", [jobs, artifacts](const httplib::Request& request,
                                                                   httplib::Response& response) {
    absl::StatusOr<v1::JobStatus> job = jobs->Get(request.matches[1], false);
    if (!job.ok()) return Error(response, job.status());
    const std::string name = request.matches[2];
    for (const v1::JobFile& file : job->files()) {
      if (file.name() != name) continue;
      if (file.digest().empty() || artifacts == nullptr) {
        return Error(response, absl::FailedPreconditionError(
                                   absl::StrCat(name, " is on the workers: ", file.location())));
      }
      absl::StatusOr<std::string> path = artifacts->PathOf(file.digest());
      if (!path.ok()) return Error(response, path.status());
      auto in = std::make_shared<std::ifstream>(*path, std::ios::binary);
      response.set_header("Content-Disposition",
                          absl::StrCat("attachment; filename=\"", name, "\""));
      response.set_content_provider(
          static_cast<size_t>(file.size_bytes()), "application/octet-stream",
          [in](size_t offset, size_t length, httplib::DataSink& sink) {
            std::string buffer(std::min<size_t>(length, 1 << 20), '\0');
            in->seekg(static_cast<std::streamoff>(offset));
            in->read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
            if (in->gcount() <= 0) return false;
            sink.write(buffer.data(), static_cast<size_t>(in->gcount()));
            return true;
          });
      return;
    }
    Error(response,
          absl::NotFoundError(absl::StrCat("job '", job->id(), "' keeps no file '", name, "'")));
  });

  s.Post(R"(/api/v1/jobs/([^/]+)/cancel)",
         [jobs](const httplib::Request& request, httplib::Response& response) {
           absl::StatusOr<v1::JobStatus> job = jobs->Cancel(request.matches[1]);
           if (!job.ok()) return Error(response, job.status());
           Reply(response, *job);
         });

  s.Get("/api/v1/workers", [workers](const httplib::Request&, httplib::Response& response) {
    v1::ListWorkersResponse out;
    for (v1::WorkerInfo& w : workers->List(absl::Now())) *out.add_workers() = std::move(w);
    Reply(response, out);
  });

  s.Get("/api/v1/groups", [groups](const httplib::Request&, httplib::Response& response) {
    v1::ListGroupsResponse out;
    for (v1::GroupInfo& g : groups->List()) *out.add_groups() = std::move(g);
    Reply(response, out);
  });

  // The cluster at a glance: workers, groups, jobs by state and what the running ones train.
  s.Get("/api/v1/cluster",
        [jobs, workers, groups](const httplib::Request&, httplib::Response& response) {
          v1::ClusterSummary out;
          for (v1::WorkerInfo& w : workers->List(absl::Now())) *out.add_workers() = std::move(w);
          for (v1::GroupInfo& g : groups->List()) *out.add_groups() = std::move(g);
          // Counted, not copied: the page asks every 2 s, and the history may hold thousands of
          // jobs.
          const JobCounts counts = jobs->Count();
          for (const auto& [state, n] : counts.by_state) {
            (*out.mutable_jobs_by_state())[v1::JobState_Name(state)] = static_cast<int32_t>(n);
          }
          out.set_samples_per_second(counts.running_samples_per_second);
          Reply(response, out);
        });

  // Server-sent events: each job status that changed ("job" events; ?job=ID for one job),
  // checked twice a second, and a comment every 15 s so proxies keep the stream open.
  auto streams = std::make_shared<EventStreams>();
  s.Get("/api/v1/events",
        [jobs, stopping, streams](const httplib::Request& request, httplib::Response& response) {
          const std::string only = request.has_param("job") ? request.get_param_value("job") : "";
          if (!only.empty()) {
            // The manager's own answer: an id too long is refused without being echoed.
            if (absl::Status known = jobs->Get(only, false).status(); !known.ok()) {
              return Error(response, known);
            }
          }
          if (absl::Status room = streams->Open(request.remote_addr); !room.ok()) {
            return Error(response, room);
          }
          auto seen = std::make_shared<std::map<std::string, std::string>>();
          auto ended = std::make_shared<std::set<std::string>>();
          auto last_write = std::make_shared<absl::Time>(absl::InfinitePast());
          auto first_round = std::make_shared<bool>(true);
          response.set_header("Cache-Control", "no-cache");
          response.set_chunked_content_provider(
              "text/event-stream",
              [jobs, only, seen, ended, last_write, first_round, stopping](
                  size_t, httplib::DataSink& sink) {
                if (stopping->load() || !sink.is_writable()) return false;
                std::string out;
                std::vector<v1::JobStatus> now;
                if (only.empty()) {
                  // Only what may have changed is copied: a job seen ended changes no more (1,000
                  // ended jobs are not copied twice a second per open page). The first round
                  // sends only what runs (a page loads the rest from /api/v1/jobs), so the jobs
                  // ended by then are only noted.
                  now = jobs->ListWhere([&](const std::string& id, v1::JobState state) {
                    if (ended->count(id) > 0) return false;
                    if (*first_round && IsTerminal(state)) {
                      ended->insert(id);
                      return false;
                    }
                    return true;
                  });
                } else if (absl::StatusOr<v1::JobStatus> one = jobs->Get(only, false); one.ok()) {
                  now.push_back(*std::move(one));
                }
                *first_round = false;
                for (const v1::JobStatus& job : now) {
                  // An ended job changes no more: once seen ended it costs nothing.
                  if (ended->count(job.id()) > 0) continue;
                  if (IsTerminal(job.state())) ended->insert(job.id());
                  const std::string json = Json(job);
                  auto it = seen->try_emplace(job.id()).first;
                  if (it->second == json) continue;
                  it->second = json;
                  // What an ended job looked like is not needed again.
                  if (IsTerminal(job.state())) seen->erase(it);
                  // A job that began and ended between two rounds is sent too, ended.
                  absl::StrAppend(&out, "event: job\ndata: ", json, "\n\n");
                }
                const absl::Time t = absl::Now();
                if (out.empty() && t - *last_write > absl::Seconds(15)) out = ": keep-alive\n\n";
                if (!out.empty()) {
                  if (!sink.write(out.data(), out.size())) return false;
                  *last_write = t;
                }
                absl::SleepFor(absl::Milliseconds(500));
                return true;
              },
              [streams, client = request.remote_addr](bool) { streams->Close(client); });
        });

  s.set_error_handler([](const httplib::Request& request, httplib::Response& response) {
    if (AnswerHttpLimitHit(response)) return;
    if (!response.body.empty()) return;
    if (response.status == 404) {
      Error(response, absl::NotFoundError(absl::StrCat("no such page or route: ", request.path,
                                                       " (the API is under /api/v1/)")));
    }
  });
}

}  // namespace dtrain
