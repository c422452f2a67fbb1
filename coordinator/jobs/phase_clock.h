// Where a job's seconds go: wall time per phase of a run (placement, setup, group formation,
// train, validation, checkpoint, test...), for the job log, `dtrain status` and the API, so
// that a slow job shows which part is slow. Phases are timed where they do not overlap (a
// checkpoint inside validation's callbacks counts as checkpoint, not validation).
//
// Time comes from an injected Clock, so the loops' unit tests read phases without sleeping.
//
// Thread-safety: none; the trainer's thread owns it.
#pragma once

#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "google/protobuf/map.h"

namespace dtrain {

class PhaseClock {
 public:
  explicit PhaseClock(Clock clock = absl::Now) : clock_(std::move(clock)) {}

  // Adds the time until it goes out of scope to its phase.
  class Span {
   public:
    Span(PhaseClock* clock, std::string phase)
        : clock_(clock), phase_(std::move(phase)), start_(clock->clock_()) {}
    Span(const Span&) = delete;
    Span& operator=(const Span&) = delete;
    ~Span() { clock_->Add(phase_, clock_->clock_() - start_); }

   private:
    PhaseClock* clock_;
    std::string phase_;
    absl::Time start_;
  };

  Span Time(std::string phase) { return Span(this, std::move(phase)); }
  void Add(const std::string& phase, absl::Duration d) { phases_[phase] += d; }
  // Replaces a phase's time (one measured elsewhere, as placement or first_step).
  void Set(const std::string& phase, absl::Duration d) { phases_[phase] = d; }
  absl::Duration Get(const std::string& phase) const {
    auto it = phases_.find(phase);
    return it == phases_.end() ? absl::ZeroDuration() : it->second;
  }

  void Export(google::protobuf::Map<std::string, double>* out) const {
    out->clear();
    for (const auto& [phase, d] : phases_) (*out)[phase] = absl::ToDoubleSeconds(d);
  }

  // "placement 0.0 s, setup 1.9 s (group 0.3 s), train 41.2 s, ...", in the order of a run;
  // "other" is what `total` has beyond the phases (scheduling, reports, teardown).
  std::string Summary(absl::Duration total) const {
    static const char* const kOrder[] = {"placement",  "setup",      "restore", "train",
                                         "validation", "checkpoint", "test",    "predict"};
    std::vector<std::string> parts;
    absl::Duration counted;
    for (const char* phase : kOrder) {
      auto it = phases_.find(phase);
      if (it == phases_.end()) continue;
      if (std::string(phase) != "placement") counted += it->second;
      std::string part = absl::StrFormat("%s %.1f s", phase, absl::ToDoubleSeconds(it->second));
      if (std::string(phase) == "setup" && phases_.count("group") > 0) {
        absl::StrAppend(
            &part, absl::StrFormat(" (group %.1f s)", absl::ToDoubleSeconds(phases_.at("group"))));
      }
      parts.push_back(part);
    }
    if (total > counted) {
      parts.push_back(absl::StrFormat("other %.1f s", absl::ToDoubleSeconds(total - counted)));
    }
    return absl::StrJoin(parts, ", ");
  }

 private:
  Clock clock_;
  std::map<std::string, absl::Duration> phases_;
};

}  // namespace dtrain
