// Whether a streamed split's reading has stalled, so that a wait for a sample ends with an error
// naming the stuck shard instead of hanging (ShardedSplitOptions::stuck_after). Progress is a
// sample read (a replayed one too: a resume late in an epoch reads for long and hands nothing
// out, and is not stuck) or, while the stream waits for a shard, a mebibyte of it downloaded.
//
// Thread-safety: none of its own; ShardedSplit calls it under its lock. Plain C++, no libtorch.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "worker/data/sample_stream.h"

namespace dtrain {

class StuckStreamWatch {
 public:
  explicit StuckStreamWatch(absl::Duration stuck_after) : stuck_after_(stuck_after) {}

  // A new stream (a new epoch or position): nothing seen of it yet, progress now.
  void Restart(absl::Time now);
  // The reader got something from the stream: a sample, its end or its error.
  void Progressed(absl::Time now) { last_progress_ = now; }
  // Records what `stream` (null: none running) did since the last look, and whether it has made
  // no progress for stuck_after since the later of `since` and its last progress. Judged when
  // looked at, so progress is dated by the look that saw it (the waits look about once a second).
  bool Stuck(const SampleStream* stream, absl::Time since, absl::Time now);
  // DEADLINE_EXCEEDED for a wait for `position` of split `split` on `rank`.
  absl::Status Error(int rank, const std::string& split, int64_t position) const;

 private:
  const absl::Duration stuck_after_;
  absl::Time last_progress_;
  // The stream's raw_read() and downloaded() at the last progress seen.
  int64_t read_seen_ = 0;
  int64_t downloaded_seen_ = 0;
};

}  // namespace dtrain
