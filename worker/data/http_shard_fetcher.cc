#include "worker/data/http_shard_fetcher.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/sha256.h"

namespace dtrain {
namespace {

// How often a transfer, a connect or a backoff looks at the cancel flag and the stall clock.
constexpr int kPollMillis = 50;
// curl's receive buffer: fewer, larger writes to the spool file than its 16 KiB default.
constexpr long kReceiveBufferBytes = 256 << 10;

absl::Status InitCurlOnce() {
  static std::once_flag once;
  static CURLcode result = CURLE_OK;
  std::call_once(once, [] { result = curl_global_init(CURL_GLOBAL_DEFAULT); });
  if (result != CURLE_OK) {
    return absl::InternalError(absl::StrCat("curl_global_init: ", curl_easy_strerror(result)));
  }
  return absl::OkStatus();
}

bool Cancelled(const std::atomic<bool>* cancelled) {
  return cancelled != nullptr && cancelled->load(std::memory_order_relaxed);
}

// curl's own error text never holds the query we pass it, but a redirect's Location might be
// quoted one day: drop anything after a '?' up to the next space.
std::string ScrubQueries(std::string text) {
  for (size_t q = text.find('?'); q != std::string::npos; q = text.find('?', q + 1)) {
    size_t end = text.find_first_of(" \t\n\"'", q);
    if (end == std::string::npos) end = text.size();
    text.replace(q, end - q, "?<redacted>");
  }
  return text;
}

// What one try of a transfer saw; owned by the try, read by the callbacks on the same thread.
struct Transfer {
  int fd = -1;
  int64_t max_bytes = 0;
  const std::atomic<bool>* cancelled = nullptr;
  std::atomic<int64_t>* received = nullptr;  // the caller's count of body bytes, or null
  std::unique_ptr<Sha256> hasher;            // null when no digest is expected
  int64_t bytes = 0;
  absl::Time last_byte = absl::InfinitePast();
  bool too_large = false;
  int write_errno = 0;
  // A 429's or 503's Retry-After in seconds (the HTTP-date form is ignored); zero when absent.
  absl::Duration retry_after = absl::ZeroDuration();
};

size_t OnHeader(char* data, size_t size, size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  t->last_byte = absl::Now();
  const absl::string_view line(data, size * count);
  constexpr absl::string_view kRetryAfter = "retry-after:";
  int seconds = 0;
  if (absl::StartsWithIgnoreCase(line, kRetryAfter) &&
      absl::SimpleAtoi(absl::StripAsciiWhitespace(line.substr(kRetryAfter.size())), &seconds) &&
      seconds > 0) {
    t->retry_after = absl::Seconds(seconds);
  }
  return size * count;
}

size_t OnBody(char* data, size_t size, size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t length = size * count;
  t->last_byte = absl::Now();
  if (t->bytes + static_cast<int64_t>(length) > t->max_bytes) {
    t->too_large = true;
    return 0;  // CURLE_WRITE_ERROR
  }
  for (size_t done = 0; done < length;) {
    const ssize_t n = write(t->fd, data + done, length - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      t->write_errno = errno;
      return 0;
    }
    done += static_cast<size_t>(n);
  }
  if (t->hasher != nullptr) t->hasher->Update(absl::string_view(data, length));
  t->bytes += static_cast<int64_t>(length);
  if (t->received != nullptr) {
    t->received->fetch_add(static_cast<int64_t>(length), std::memory_order_relaxed);
  }
  return length;
}

// Aborts an active transfer as soon as curl reports progress; the loop in RunTry covers the
// quiet stretches, when curl calls this only about once a second.
int OnProgress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  return Cancelled(static_cast<Transfer*>(user)->cancelled) ? 1 : 0;
}

struct EasyDeleter {
  void operator()(CURL* easy) const { curl_easy_cleanup(easy); }
};
struct MultiDeleter {
  void operator()(CURLM* multi) const { curl_multi_cleanup(multi); }
};

enum class Verdict { kDone, kRetry, kFail };

// How one try ended: kDone with the body in the file, or the status code it would fail with and
// what to say about it (without the URL, which the caller adds).
struct TryResult {
  Verdict verdict = Verdict::kFail;
  absl::StatusCode code = absl::StatusCode::kUnknown;
  std::string what;
};

TryResult Retry(absl::StatusCode code, std::string what) {
  return {Verdict::kRetry, code, std::move(what)};
}
TryResult Fail(absl::StatusCode code, std::string what) {
  return {Verdict::kFail, code, std::move(what)};
}

TryResult ClassifyHttpStatus(long status) {
  const std::string what = absl::StrCat("HTTP ", status);
  if (status == 404 || status == 410) return Fail(absl::StatusCode::kNotFound, what);
  if (status == 401 || status == 403) return Fail(absl::StatusCode::kPermissionDenied, what);
  // 408 is the server giving up on a slow request, and 429 asks us to come back later.
  if (status >= 500 || status == 408 || status == 429) {
    return Retry(absl::StatusCode::kUnavailable, what);
  }
  return Fail(absl::StatusCode::kInvalidArgument, what);
}

TryResult ClassifyCurlError(CURLcode code, const std::string& message, const Transfer& t,
                            const HttpFetchOptions& options, CURL* easy) {
  const std::string what = ScrubQueries(message.empty() ? curl_easy_strerror(code) : message);
  switch (code) {
    case CURLE_HTTP_RETURNED_ERROR: {
      long status = 0;
      curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &status);
      return ClassifyHttpStatus(status);
    }
    case CURLE_OPERATION_TIMEDOUT:
      return Retry(absl::StatusCode::kDeadlineExceeded, what);
    case CURLE_PARTIAL_FILE:
      // Shorter than its Content-Length: usually a connection reset mid-body, so retried.
      return Retry(absl::StatusCode::kDataLoss,
                   absl::StrCat("body truncated after ", t.bytes, " bytes: ", what));
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_COULDNT_CONNECT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_WEIRD_SERVER_REPLY:
      return Retry(absl::StatusCode::kUnavailable, what);
    case CURLE_FILESIZE_EXCEEDED:
      return Fail(absl::StatusCode::kResourceExhausted,
                  absl::StrCat("Content-Length over max_bytes (", options.max_bytes, ")"));
    case CURLE_WRITE_ERROR:
      if (t.too_large) {
        return Fail(absl::StatusCode::kResourceExhausted,
                    absl::StrCat("body over max_bytes (", options.max_bytes, ")"));
      }
      if (t.write_errno != 0) {
        return Fail(absl::ErrnoToStatusCode(t.write_errno),
                    absl::StrCat("writing the spool file: ", strerror(t.write_errno)));
      }
      return Fail(absl::StatusCode::kInternal, what);
    case CURLE_PEER_FAILED_VERIFICATION:
      return Fail(absl::StatusCode::kFailedPrecondition,
                  absl::StrCat(what, " (an https server signed by a private CA needs ca_file)"));
    case CURLE_SSL_CACERT_BADFILE:
      return Fail(absl::StatusCode::kInvalidArgument,
                  absl::StrCat(what, " (HttpFetchOptions.ca_file)"));
    case CURLE_UNSUPPORTED_PROTOCOL:
    case CURLE_URL_MALFORMAT:
    case CURLE_TOO_MANY_REDIRECTS:
      return Fail(absl::StatusCode::kInvalidArgument, what);
    default:
      return Fail(absl::StatusCode::kUnknown, what);
  }
}

// One GET, driven with the multi interface so the cancel flag and the stall clock are looked at
// every kPollMillis whatever curl is waiting for.
TryResult RunTry(const std::string& url, const HttpFetchOptions& options,
                 const std::atomic<bool>* cancelled, Transfer& t) {
  std::unique_ptr<CURL, EasyDeleter> easy(curl_easy_init());
  std::unique_ptr<CURLM, MultiDeleter> multi(curl_multi_init());
  if (easy == nullptr || multi == nullptr) {
    return Fail(absl::StatusCode::kResourceExhausted, "curl: out of memory");
  }
  char error[CURL_ERROR_SIZE] = {0};
  CURL* e = easy.get();
  curl_easy_setopt(e, CURLOPT_URL, url.c_str());
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(e, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(e, CURLOPT_MAXREDIRS, static_cast<long>(options.max_redirects));
  // HTTP errors end the transfer before their body (an error page) reaches the spool file.
  curl_easy_setopt(e, CURLOPT_FAILONERROR, 1L);
  curl_easy_setopt(e, CURLOPT_USERAGENT, "dtrain-worker");
  curl_easy_setopt(e, CURLOPT_ERRORBUFFER, error);
  curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(absl::ToInt64Milliseconds(options.connect_timeout)));
  if (options.attempt_timeout > absl::ZeroDuration()) {
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS,
                     static_cast<long>(absl::ToInt64Milliseconds(options.attempt_timeout)));
  }
  curl_easy_setopt(e, CURLOPT_MAXFILESIZE_LARGE, static_cast<curl_off_t>(options.max_bytes));
  curl_easy_setopt(e, CURLOPT_BUFFERSIZE, kReceiveBufferBytes);
  curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
  if (!options.ca_file.empty()) curl_easy_setopt(e, CURLOPT_CAINFO, options.ca_file.c_str());
  curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, OnHeader);
  curl_easy_setopt(e, CURLOPT_HEADERDATA, &t);
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, OnBody);
  curl_easy_setopt(e, CURLOPT_WRITEDATA, &t);
  curl_easy_setopt(e, CURLOPT_XFERINFOFUNCTION, OnProgress);
  curl_easy_setopt(e, CURLOPT_XFERINFODATA, &t);
  curl_easy_setopt(e, CURLOPT_NOPROGRESS, 0L);
  if (curl_multi_add_handle(multi.get(), e) != CURLM_OK) {
    return Fail(absl::StatusCode::kInternal, "curl_multi_add_handle failed");
  }

  // The stall clock starts once the request is on its way (connect_timeout covers the time
  // before), and restarts with every byte received.
  absl::Time request_sent = absl::InfinitePast();
  std::optional<TryResult> abandoned;
  int running = 1;
  while (true) {
    const CURLMcode mc = curl_multi_perform(multi.get(), &running);
    if (mc != CURLM_OK) {
      abandoned = Fail(absl::StatusCode::kInternal,
                       absl::StrCat("curl_multi_perform: ", curl_multi_strerror(mc)));
      break;
    }
    if (running == 0) break;
    if (Cancelled(cancelled)) {
      abandoned = Fail(absl::StatusCode::kCancelled, "cancelled");
      break;
    }
    const absl::Time now = absl::Now();
    if (request_sent == absl::InfinitePast()) {
      curl_off_t pretransfer = 0;
      curl_easy_getinfo(e, CURLINFO_PRETRANSFER_TIME_T, &pretransfer);
      if (pretransfer > 0) request_sent = now;
    } else if (now - std::max(request_sent, t.last_byte) >= options.stall_timeout) {
      abandoned =
          Retry(absl::StatusCode::kDeadlineExceeded,
                absl::StrCat("no byte received for ", absl::FormatDuration(options.stall_timeout),
                             " (stall_timeout) after ", t.bytes, " body bytes"));
      break;
    }
    const CURLMcode polled = curl_multi_poll(multi.get(), nullptr, 0, kPollMillis, nullptr);
    if (polled != CURLM_OK) {  // would otherwise spin
      abandoned = Fail(absl::StatusCode::kInternal,
                       absl::StrCat("curl_multi_poll: ", curl_multi_strerror(polled)));
      break;
    }
  }
  CURLcode code = CURLE_OK;
  bool finished = false;
  int queued = 0;
  while (CURLMsg* msg = curl_multi_info_read(multi.get(), &queued)) {
    if (msg->msg == CURLMSG_DONE) {
      code = msg->data.result;
      finished = true;
    }
  }
  curl_multi_remove_handle(multi.get(), e);
  if (abandoned.has_value()) return *abandoned;
  if (Cancelled(cancelled) && code == CURLE_ABORTED_BY_CALLBACK) {
    return Fail(absl::StatusCode::kCancelled, "cancelled");
  }
  if (!finished) return Fail(absl::StatusCode::kInternal, "curl ended without a result");
  if (code != CURLE_OK) return ClassifyCurlError(code, error, t, options, e);
  long status = 0;
  curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
  if (status < 200 || status > 299) {
    return Fail(absl::StatusCode::kInvalidArgument,
                absl::StrCat("unexpected HTTP ", status, " (a redirect without Location?)"));
  }
  return {Verdict::kDone, absl::StatusCode::kOk, ""};
}

// Sleeps `duration`, returning early (false) when cancelled.
bool SleepUnlessCancelled(absl::Duration duration, const std::atomic<bool>* cancelled) {
  const absl::Time until = absl::Now() + duration;
  while (!Cancelled(cancelled)) {
    const absl::Duration left = until - absl::Now();
    if (left <= absl::ZeroDuration()) return true;
    absl::SleepFor(std::min(left, absl::Milliseconds(kPollMillis)));
  }
  return false;
}

absl::Status CheckOptions(const HttpFetchOptions& o) {
  if (o.max_attempts < 1 || o.max_bytes < 0 || o.max_redirects < 0 ||
      o.connect_timeout <= absl::ZeroDuration() || o.stall_timeout <= absl::ZeroDuration() ||
      o.attempt_timeout < absl::ZeroDuration() || o.initial_backoff < absl::ZeroDuration() ||
      o.max_backoff < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "HttpFetchOptions: need max_attempts >= 1 (got ", o.max_attempts,
        "), max_bytes and max_redirects >= 0, positive connect and stall timeouts, and "
        "non-negative attempt_timeout and backoffs"));
  }
  return absl::OkStatus();
}

// Removes the spool file unless released (it has been renamed into place).
class SpoolFile {
 public:
  explicit SpoolFile(const std::string& dest_path) : path_(dest_path + ".part-XXXXXX") {
    fd_ = mkostemp(path_.data(), O_CLOEXEC);
  }
  ~SpoolFile() {
    if (fd_ >= 0) close(fd_);
    if (!released_ && fd_ >= 0) unlink(path_.c_str());
  }
  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  void Release() { released_ = true; }

 private:
  std::string path_;
  int fd_ = -1;
  bool released_ = false;
};

absl::Status ErrnoStatus(int error, absl::string_view what) {
  return absl::Status(absl::ErrnoToStatusCode(error), absl::StrCat(what, ": ", strerror(error)));
}

}  // namespace

std::string RedactUrl(absl::string_view url) {
  std::string out(url);
  const size_t cut = out.find_first_of("?#");
  if (cut != std::string::npos) {
    out = absl::StrCat(out.substr(0, cut), out[cut] == '?' ? "?" : "#", "<redacted>");
  }
  const size_t scheme = out.find("://");
  if (scheme != std::string::npos) {
    const size_t host = scheme + 3;
    const size_t path = out.find_first_of("/?#", host);
    const size_t at = out.rfind('@', path == std::string::npos ? out.size() : path);
    if (at != std::string::npos && at >= host) out.replace(host, at - host, "<redacted>");
  }
  return out;
}

absl::StatusOr<int64_t> FetchUrlToFile(const std::string& url, const std::string& dest_path,
                                       const std::string& expected_digest,
                                       const HttpFetchOptions& options,
                                       const std::atomic<bool>* cancelled,
                                       std::atomic<int64_t>* received) {
  const std::string shown = RedactUrl(url);
  if (!IsHttpUrl(url)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", shown, "' is not an http:// or https:// URL"));
  }
  if (!expected_digest.empty()) {
    const absl::Status digest_ok = CheckDigest(expected_digest);
    if (!digest_ok.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("fetching ", shown, ": ", digest_ok.message()));
    }
  }
  if (absl::Status s = CheckOptions(options); !s.ok()) return s;
  if (absl::Status s = InitCurlOnce(); !s.ok()) return s;

  SpoolFile spool(dest_path);
  if (spool.fd() < 0) {
    // The destination's directory is missing, read-only or full: the worker's setup, not the URL.
    const int error = errno;
    return absl::Status(error == ENOSPC || error == EDQUOT ? absl::StatusCode::kResourceExhausted
                                                           : absl::StatusCode::kFailedPrecondition,
                        absl::StrCat("fetching ", shown, ": cannot create '", spool.path(),
                                     "' beside the destination: ", strerror(error)));
  }
  const auto fail = [&](absl::StatusCode code, absl::string_view what, int tries) {
    return absl::Status(code, absl::StrCat("fetching ", shown, ": ", what, " (", tries,
                                           tries == 1 ? " try" : " tries", ")"));
  };

  absl::BitGen jitter;
  int digest_mismatches = 0;
  TryResult last;
  absl::Duration retry_after = absl::ZeroDuration();
  for (int attempt = 1; attempt <= options.max_attempts; ++attempt) {
    if (attempt > 1) {
      // initial_backoff * 2^(attempt-2), capped, then drawn from [half, all] of it.
      absl::Duration wait = options.initial_backoff;
      for (int i = 2; i < attempt && wait < options.max_backoff; ++i) wait *= 2;
      wait = std::min(wait, options.max_backoff);
      wait = wait * absl::Uniform(jitter, 0.5, 1.0);
      // A server that says when to come back is believed, up to max_backoff.
      wait = std::max(wait, std::min(retry_after, options.max_backoff));
      LogWarning("shard download failed; retrying", {{"url", shown},
                                                     {"try", attempt - 1},
                                                     {"max_attempts", options.max_attempts},
                                                     {"error", last.what},
                                                     {"retry_in", absl::FormatDuration(wait)}});
      if (!SleepUnlessCancelled(wait, cancelled)) {
        return fail(absl::StatusCode::kCancelled, "cancelled", attempt - 1);
      }
    }
    if (Cancelled(cancelled)) return fail(absl::StatusCode::kCancelled, "cancelled", attempt - 1);
    if (ftruncate(spool.fd(), 0) != 0 || lseek(spool.fd(), 0, SEEK_SET) != 0) {
      return ErrnoStatus(errno, absl::StrCat("fetching ", shown, ": truncating ", spool.path()));
    }
    Transfer t;
    t.fd = spool.fd();
    t.max_bytes = options.max_bytes;
    t.cancelled = cancelled;
    t.received = received;
    // SHA-256 runs at about 300 MB/s on this machine's cores, slower than loopback, so only
    // when there is a digest to check.
    if (!expected_digest.empty()) t.hasher = std::make_unique<Sha256>();
    last = RunTry(url, options, cancelled, t);
    retry_after = t.retry_after;
    if (last.verdict == Verdict::kDone) {
      const std::string digest = t.hasher != nullptr ? t.hasher->Finish() : "";
      if (digest == expected_digest) {
        if (rename(spool.path().c_str(), dest_path.c_str()) != 0) {
          return ErrnoStatus(errno, absl::StrCat("fetching ", shown, ": renaming ", spool.path(),
                                                 " to ", dest_path));
        }
        spool.Release();
        return t.bytes;
      }
      // A CDN or proxy may serve a torn or stale object once; twice means the list is wrong.
      ++digest_mismatches;
      last = {digest_mismatches >= 2 ? Verdict::kFail : Verdict::kRetry,
              absl::StatusCode::kDataLoss,
              absl::StrCat("digest mismatch: the shard list says ", expected_digest, ", the ",
                           t.bytes, " bytes received hash to ", digest,
                           digest_mismatches >= 2 ? " (twice)" : "")};
    }
    if (last.verdict == Verdict::kFail) return fail(last.code, last.what, attempt);
  }
  return fail(last.code, last.what, options.max_attempts);
}

std::function<absl::Status(const std::string& url, const std::string& dest,
                           const std::string& digest, const std::atomic<bool>* cancelled,
                           absl::Duration attempt_timeout, std::atomic<int64_t>* received)>
UrlFetcher(HttpFetchOptions options) {
  return [options](const std::string& url, const std::string& dest, const std::string& digest,
                   const std::atomic<bool>* cancelled, absl::Duration attempt_timeout,
                   std::atomic<int64_t>* received) {
    HttpFetchOptions o = options;
    // The tighter of the two bounds (zero: none).
    if (attempt_timeout > absl::ZeroDuration() &&
        (o.attempt_timeout <= absl::ZeroDuration() || attempt_timeout < o.attempt_timeout)) {
      o.attempt_timeout = attempt_timeout;
    }
    return FetchUrlToFile(url, dest, digest, o, cancelled, received).status();
  };
}

}  // namespace dtrain
