#include "client/progress_view.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/job_spec.h"

namespace dtrain {

std::string FormatSeconds(double seconds) {
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return absl::StrFormat("%dh%02dm", s / 3600, (s % 3600) / 60);
  if (s >= 60) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrCat(s, "s");
}

std::string ProgressLine(const v1::JobStatus& status, int bar_width) {
  const v1::JobProgress& p = status.progress();
  std::string line = absl::StrCat(status.id(), " ", v1::JobState_Name(status.state()));
  if (status.state() == v1::QUEUED) return absl::StrCat(line, " (waiting for workers)");
  if (status.state() != v1::RUNNING) {
    return status.reason().empty() ? line : absl::StrCat(line, ": ", status.reason());
  }
  absl::StrAppend(&line, " ", p.phase());
  if (p.max_epochs() > 0 && p.max_epochs() < kNoEpochLimit) {
    absl::StrAppend(&line, " epoch ", p.epoch() + 1, "/", p.max_epochs());
  }
  if (p.total_steps() > 0) {
    const double fraction = std::min(1.0, static_cast<double>(p.global_step()) / p.total_steps());
    const int filled = static_cast<int>(fraction * bar_width);
    absl::StrAppend(&line, " [", std::string(filled, '#'), std::string(bar_width - filled, '.'),
                    "] step ", p.global_step(), "/", p.total_steps());
  }
  if (p.global_step() > 0) {
    // The training rate once reported: validation and checkpoints are not training speed.
    const double rate =
        p.train_samples_per_second() > 0 ? p.train_samples_per_second() : p.samples_per_second();
    absl::StrAppend(&line, absl::StrFormat(" loss %.4f", p.train_loss()),
                    absl::StrFormat(" %.0f samples/s", rate));
    if (p.eta_seconds() > 0) absl::StrAppend(&line, " ETA ", FormatSeconds(p.eta_seconds()));
  }
  // What the model logs with prog_bar=True, as Lightning's progress bar shows it.
  for (const std::string& name : p.prog_bar()) {
    auto it = status.metrics().find(name);
    if (it != status.metrics().end())
      absl::StrAppend(&line, absl::StrFormat(" %s %.4g", name, it->second));
  }
  return line;
}

std::string PhaseLine(const v1::JobProgress& progress) {
  static const char* const kOrder[] = {"placement", "setup",  "group",      "first_step",
                                       "restore",   "train",  "validation", "checkpoint",
                                       "test",      "predict"};
  std::vector<std::string> parts;
  for (const char* phase : kOrder) {
    auto it = progress.phase_seconds().find(phase);
    if (it != progress.phase_seconds().end())
      parts.push_back(absl::StrFormat("%s %.1fs", phase, it->second));
  }
  return absl::StrJoin(parts, ", ");
}

void ProgressView::Show(const v1::JobStatus& status) {
  const std::string line = ProgressLine(status);
  if (terminal_) {
    // \r and clear-to-end-of-line: the line is redrawn in place.
    std::printf("\r%s\033[K", line.c_str());
    std::fflush(stdout);
    drawn_ = true;
    return;
  }
  const int64_t now = absl::ToUnixMillis(absl::Now());
  const int64_t total = status.progress().total_steps();
  const int64_t step = status.progress().global_step();
  const bool changed =
      status.progress().phase() != last_phase_ || static_cast<int>(status.state()) != last_state_;
  const bool advanced = total > 0 && last_step_ >= 0 && (step - last_step_) * 10 >= total;
  if (!changed && !advanced && now - last_time_ms_ < 10000) return;
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  last_phase_ = status.progress().phase();
  last_state_ = static_cast<int>(status.state());
  last_step_ = step;
  last_time_ms_ = now;
}

void ProgressView::Done() {
  if (terminal_ && drawn_) std::printf("\n");
  drawn_ = false;
}

}  // namespace dtrain
