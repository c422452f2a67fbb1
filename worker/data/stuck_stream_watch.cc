// A streamed split's stall detection; see stuck_stream_watch.h.
#include "worker/data/stuck_stream_watch.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace dtrain {
namespace {

// A stream is not stuck while it downloads at least this much per stuck_after (1 MiB in the
// default 10 minutes: 1.75 KB/s).
constexpr int64_t kDownloadProgressBytes = int64_t{1} << 20;

}  // namespace

void StuckStreamWatch::Restart(absl::Time now) {
  last_progress_ = now;
  read_seen_ = 0;
  downloaded_seen_ = 0;
}

bool StuckStreamWatch::Stuck(const SampleStream* stream, absl::Time since, absl::Time now) {
  const int64_t read = stream != nullptr ? stream->raw_read() : read_seen_;
  const int64_t downloaded = stream != nullptr ? stream->downloaded() : downloaded_seen_;
  // A download counts by the mebibyte: a server that trickles a byte at a time, each within
  // the fetcher's stall timeout, would otherwise hold the job forever. And only while the
  // stream waits for it: the next shard's download, under way while this one is read, says
  // nothing about a read that is stuck.
  const bool awaiting = stream != nullptr && stream->awaiting_shard();
  // (A stream swapped in for a replay's next pass counts from zero again.)
  if (read != read_seen_ || downloaded < downloaded_seen_ ||
      (awaiting && downloaded - downloaded_seen_ >= kDownloadProgressBytes)) {
    read_seen_ = read;
    downloaded_seen_ = downloaded;
    last_progress_ = now;
  } else if (!awaiting) {
    downloaded_seen_ = downloaded;
  }
  return now - std::max(since, last_progress_) > stuck_after_;
}

absl::Status StuckStreamWatch::Error(int rank, const std::string& split, int64_t position) const {
  return absl::DeadlineExceededError(absl::StrCat(
      "rank ", rank, ": the ", split, " stream read no sample and downloaded less than 1 MiB in ",
      absl::FormatDuration(stuck_after_), " (waiting for position ", position,
      "); the shard being read is stuck"));
}

}  // namespace dtrain
