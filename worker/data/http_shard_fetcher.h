// Downloads one shard over HTTP(S) to a local file with libcurl (Debian's libcurl4-openssl-dev):
// how a worker reads shards kept in S3 or GCS buckets (public or presigned URLs), on a web
// server or behind a CDN. Transient failures (5xx, 429, 408, refused or reset connections,
// timeouts, truncated bodies) are retried with capped, jittered exponential backoff; a digest
// from the shard list is checked over the bytes as they arrive; a polled flag cancels promptly.
// Status messages name the URL without its query string or user:password, since a presigned
// URL's query carries its credentials. Plain C++ (no libtorch).
//
// Thread-safety: FetchUrlToFile may run on any number of threads at once; each call has its own
// curl handles. Two calls must not write the same dest_path concurrently.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/file_reference.h"  // IsHttpUrl

namespace dtrain {

struct HttpFetchOptions {
  // TCP connect plus the TLS handshake, per try.
  absl::Duration connect_timeout = absl::Seconds(10);
  // No byte (header or body) received for this long after the request went out: a timed-out try.
  absl::Duration stall_timeout = absl::Seconds(30);
  // A whole try, connect to last byte; zero for none (a 64 GiB shard may take long legitimately).
  absl::Duration attempt_timeout = absl::ZeroDuration();
  // Tries in all, the first included (>= 1).
  int max_attempts = 5;
  // The wait before the second try; doubled for each later one and capped at max_backoff. Each
  // wait is drawn uniformly from [half, all] of that, so ranks that failed together spread out.
  // A Retry-After (in seconds) on the failed answer lengthens the wait, up to max_backoff.
  absl::Duration initial_backoff = absl::Milliseconds(500);
  absl::Duration max_backoff = absl::Seconds(8);
  // A body larger than this is refused: before it is read when the server sends Content-Length,
  // else as soon as the bytes received pass it.
  int64_t max_bytes = int64_t{64} << 30;
  // A PEM bundle of CAs for https (a private cluster's CA). It replaces libcurl's bundle file;
  // the system's hashed directory (/etc/ssl/certs) stays trusted. Empty: the system's store.
  std::string ca_file;
  // Redirects followed (to http or https only).
  int max_redirects = 5;
};

// `url` safe to print: the query replaced by "?<redacted>" (or the fragment by "#<redacted>")
// and any user:password@ by "<redacted>@" ("https://b.s3.amazonaws.com/s-000.tar?<redacted>").
std::string RedactUrl(absl::string_view url);

// Downloads `url` into `dest_path`: written to a temporary file beside it (same directory, so the
// rename is atomic) and renamed over dest_path only when complete and verified, so dest_path
// never holds a partial or unverified shard; the temporary file is removed on every failure.
// `expected_digest` ("sha256:<64 lowercase hex>", or empty for no check) is computed over the
// bytes as they stream (common/sha256.h). `cancelled` (may be null) is polled at least every
// 50 ms, also while connecting and between tries. `received` (may be null) gets every body byte
// added as it arrives, those of failed tries included: a caller's sign that a long download is
// alive. Returns the bytes written.
//
// Errors (each message names the redacted URL, the HTTP status or curl's error, and the tries):
//   INVALID_ARGUMENT    not an http(s) URL, a malformed digest or options; HTTP 4xx other than
//                       those below; a redirect to another scheme or too many redirects. No retry.
//   NOT_FOUND           HTTP 404 or 410. No retry.
//   PERMISSION_DENIED   HTTP 401 or 403 (for a presigned URL: expired or wrong signature).
//   UNAVAILABLE         HTTP 5xx, 429 or 408, a refused/reset connection or an unresolvable
//                       host, on every one of max_attempts tries.
//   DEADLINE_EXCEEDED   as UNAVAILABLE, but the last try timed out (connect, stall or attempt).
//   DATA_LOSS           the last try's body was shorter than its Content-Length (retried like a
//                       reset connection), or the digest did not match on two downloads (one
//                       retry: a CDN may serve a torn object once).
//   RESOURCE_EXHAUSTED  the body is larger than max_bytes, or the disk is full.
//   FAILED_PRECONDITION the server's TLS certificate is not trusted (see ca_file).
//   CANCELLED           *cancelled became true; returns within about 100 ms.
//   Another code (from errno) when the temporary file cannot be written or renamed.
absl::StatusOr<int64_t> FetchUrlToFile(const std::string& url, const std::string& dest_path,
                                       const std::string& expected_digest,
                                       const HttpFetchOptions& options,
                                       const std::atomic<bool>* cancelled = nullptr,
                                       std::atomic<int64_t>* received = nullptr);

// FetchUrlToFile with `options` as the function a ShardFetcher's `url` is
// (worker/data/shard_catalog.h): a call's nonzero attempt_timeout applies when it is tighter
// than options'.
std::function<absl::Status(const std::string& url, const std::string& dest,
                           const std::string& digest, const std::atomic<bool>* cancelled,
                           absl::Duration attempt_timeout, std::atomic<int64_t>* received)>
UrlFetcher(HttpFetchOptions options);

}  // namespace dtrain
