// dtrain-bench-artifacts: one file through the coordinator's Artifacts service, timed, as
// bench/artifacts.sh runs it: the first upload (hash + send + verify + store), the second
// (hash + Stat: nothing sent), the fetch (receive + verify + write), and the local SHA-256
// alone (the floor of both). One JSON object per line.
#include <cstdio>
#include <filesystem>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/time/clock.h"
#include "client/artifacts_client.h"
#include "common/channel.h"
#include "common/sha256.h"

ABSL_FLAG(std::string, coordinator, "127.0.0.1:29610", "coordinator host:port");
ABSL_FLAG(std::string, file, "", "the file to send");
ABSL_FLAG(std::string, fetch_to, "", "where the fetched copy goes");

namespace {

void Row(const char* op, int64_t bytes, absl::Duration took) {
  const double seconds = absl::ToDoubleSeconds(took);
  std::printf(
      "{\"system\": \"dtrain-artifacts\", \"op\": \"%s\", \"bytes\": %lld, \"seconds\": %.3f, "
      "\"gbps\": %.4f}\n",
      op, static_cast<long long>(bytes), seconds, seconds > 0 ? bytes / seconds / 1e9 : 0.0);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string file = absl::GetFlag(FLAGS_file);
  dtrain::ArtifactsClient client(dtrain::ConnectToCoordinator(absl::GetFlag(FLAGS_coordinator)));

  absl::Time start = absl::Now();
  absl::StatusOr<std::string> digest = dtrain::Sha256OfFile(file);
  if (!digest.ok()) {
    std::fprintf(stderr, "%s\n", std::string(digest.status().message()).c_str());
    return 1;
  }
  std::error_code error;
  const int64_t size = static_cast<int64_t>(std::filesystem::file_size(file, error));
  Row("sha256_local", size, absl::Now() - start);

  start = absl::Now();
  absl::StatusOr<dtrain::UploadResult> first = client.Upload(file);
  if (!first.ok() || !first->sent) {
    std::fprintf(stderr, "upload: %s\n",
                 first.ok() ? "nothing sent (not a fresh store)"
                            : std::string(first.status().message()).c_str());
    return 1;
  }
  Row("upload_first", size, absl::Now() - start);

  start = absl::Now();
  absl::StatusOr<dtrain::UploadResult> second = client.Upload(file);
  if (!second.ok() || second->sent) return 1;
  Row("upload_again_skipped", size, absl::Now() - start);

  start = absl::Now();
  absl::Status fetched = client.Fetch(first->digest, absl::GetFlag(FLAGS_fetch_to));
  if (!fetched.ok()) {
    std::fprintf(stderr, "fetch: %s\n", std::string(fetched.message()).c_str());
    return 1;
  }
  Row("fetch_verified", size, absl::Now() - start);
  return 0;
}
