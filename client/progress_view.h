// How `dtrain watch` shows a job: one status line (epoch, a bar of step/total, loss,
// samples/s, ETA) redrawn in place on a terminal, or plain lines, one per noteworthy change,
// when stdout is not a terminal (a log file, CI).
#pragma once

#include <cstdint>
#include <string>

#include "dtrain/v1/jobs.pb.h"

namespace dtrain {

// "fashion-cnn-1 RUNNING train epoch 1/2 [#####.....] step 500/1718 loss 0.4123 1234 samples/s ETA
// 1m23s"
std::string ProgressLine(const v1::JobStatus& status, int bar_width = 24);

// "placement 0.0s, setup 1.9s, group 0.3s, first_step 2.0s, train 41.2s, ...": where the
// job's seconds went (JobProgress.phase_seconds), in the order of a run.
std::string PhaseLine(const v1::JobProgress& progress);

// "1m23s", "2h05m", "12s".
std::string FormatSeconds(double seconds);

class ProgressView {
 public:
  explicit ProgressView(bool terminal) : terminal_(terminal) {}
  // Draws `status`: always on a terminal; otherwise only when the phase or state changed, a
  // tenth of the steps passed, or 10 s went by.
  void Show(const v1::JobStatus& status);
  // Ends the line drawn in place.
  void Done();

 private:
  bool terminal_;
  std::string last_phase_;
  int last_state_ = -1;
  int64_t last_step_ = -1;
  int64_t last_time_ms_ = 0;
  bool drawn_ = false;
};

}  // namespace dtrain
