// How many batches each training step RPC carries. A job's spec can fix the number
// (trainer.batches_per_call); by default (0) it is sized from the time the job's calls take, so
// that a call lasts about 0.25 s whatever the model: each call costs the coordinator a round
// trip and the workers an idle gap (~0.7 ms measured for a 2-worker job on loopback), 4% of a
// 16-batch call of the 1.1 ms MLP step, 0.2% of a 0.25 s call; and a call of a slow model
// stays short enough that progress, logged metrics and drain stay responsive. (Cancellation
// does not wait for a call's end: workers check it between batches.)
//
// Thread-safety: none; the trainer's thread owns it.
#pragma once

#include <cstdint>
#include <string>

#include "absl/time/time.h"

namespace dtrain {

class StepCallSizer {
 public:
  // What an automatic call aims to last, and the bounds of its size.
  static constexpr absl::Duration kTarget = absl::Milliseconds(250);
  static constexpr int64_t kFirst = 16;   // before anything was measured (and predict's size)
  static constexpr int64_t kMost = 1024;  // a request's indices stay well inside 4 MiB
  static constexpr int64_t kGrowth = 4;   // per call, so a model's warm-up is not extrapolated

  // fixed > 0: every call carries that many batches; 0: sized automatically.
  explicit StepCallSizer(int64_t fixed) : fixed_(fixed) {}

  // Batches for the next call (the trainer still stops it at epoch, validation and max_steps
  // boundaries).
  int64_t Next() const { return fixed_ > 0 ? fixed_ : next_; }
  // Batches for the next call when `to_boundary` batches are left before the next point a call
  // must end at (the epoch's end, validation, max_steps, a checkpoint's step): Next(), except
  // that an automatic call also takes the rest when the rest would make a call under half of
  // Next(). Each call leaves the workers idle between calls: the MLP's 430-batch epochs took a
  // ~375-batch call and a ~55-batch one, and take one call now. A call so carries under 1.5x
  // Next() and never more than kMost batches. `to_boundary` >= 1 (at most it is returned).
  int64_t Until(int64_t to_boundary) const;
  // A call of `batches` batches took `took`, from when the workers could start it (its
  // sending, or the call before it's answer when it was pipelined) to its last answer.
  void Observe(int64_t batches, absl::Duration took, bool pipelined = false);

  // Batches per predict call: outputs travel back, so the fixed size or kFirst, never grown.
  int64_t PredictBatches() const { return fixed_ > 0 ? fixed_ : kFirst; }
  // For the job log: "N training calls (batches per call: 8)" or "(... auto, up to 250)", then
  // ", M pipelined" when some were.
  std::string Summary() const;

 private:
  const int64_t fixed_;
  int64_t next_ = kFirst;
  int calls_ = 0;        // observed
  int pipelined_ = 0;    // of which sent before the call ahead of them answered
  int64_t largest_ = 0;  // batches in the largest observed call
};

}  // namespace dtrain
