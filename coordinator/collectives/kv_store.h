// KeyValueStore: the coordinator's scoped key-value store, the rendezvous store other engines
// (Gloo's, c10d's) can build on. Scopes are usually group ids; a scope is deleted when its
// group's last member leaves.
//
// Bounded (KeyValueLimits): a caller allowed into a scope cannot grow the coordinator without
// limit, by values, keys or Get calls left waiting; past a limit the call answers
// RESOURCE_EXHAUSTED naming it.
//
// Thread-safety: all methods may be called from any thread; Get callbacks run outside the lock.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/key_page.h"

namespace dtrain {

// What the store keeps at most. A rendezvous store holds addresses and counters: kilobytes per
// group, so these are far above real use.
struct KeyValueLimits {
  // A value's Get answer fits a default client's 4 MiB, with room for the message around it.
  size_t max_value_bytes = (size_t{4} << 20) - (64 << 10);
  size_t scope_bytes = size_t{64} << 20;  // keys and values of one scope
  size_t scope_keys = 16384;
  size_t total_bytes = size_t{512} << 20;
  int scope_waiters = 1024;  // Get calls waiting for a writer
  int total_waiters = 16384;
};

class KeyValueStore {
 public:
  using GetDone = std::function<void(absl::StatusOr<std::string>)>;
  struct CasResult {
    bool swapped = false;
    bool present = false;
    std::string value;
  };

  // `clock` stamps waits' deadlines (Tick expires them).
  explicit KeyValueStore(Clock clock = absl::Now, KeyValueLimits limits = {})
      : clock_(std::move(clock)), limits_(limits) {}

  // INVALID_ARGUMENT on an empty or oversized scope, key or value; RESOURCE_EXHAUSTED when the
  // scope's or the store's bytes or the scope's keys would pass their limit.
  absl::Status Set(const std::string& scope, const std::string& key, std::string value);

  // Answers at once if present; NOT_FOUND if absent and `wait` is zero; otherwise waits up to
  // `wait` for a writer, then DEADLINE_EXCEEDED (RESOURCE_EXHAUSTED when too many wait).
  void Get(const std::string& scope, const std::string& key, absl::Duration wait, GetDone done);

  // FAILED_PRECONDITION if the stored value is not a decimal int64.
  absl::StatusOr<int64_t> Add(const std::string& scope, const std::string& key, int64_t delta);

  absl::StatusOr<CasResult> CompareAndSet(const std::string& scope, const std::string& key,
                                          const std::string& expected, std::string desired);

  absl::StatusOr<bool> Delete(const std::string& scope, const std::string& key);

  // Sorted by key; with `page`, the entries it holds.
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> List(
      const std::string& scope, const std::string& prefix, KeyPage* page = nullptr) const;

  void DeleteScope(const std::string& scope);

  // Fails Get waiters whose wait ran out. Returns whether others still wait.
  bool Tick(absl::Time now);
  // Fails every waiter with UNAVAILABLE.
  void Stop();
  // Get calls waiting for a writer now (for tests: the moment a reader waits is observable).
  int WaitingGets() const;

 private:
  const Clock clock_;
  const KeyValueLimits limits_;
  struct Waiter {
    std::string scope;
    std::string key;
    absl::Time deadline;
    absl::Duration wait;
    GetDone done;
  };
  using Completion = std::function<void()>;

  // Moves out the waiters of (scope, key) that can now be answered.
  void Wake(const std::string& scope, const std::string& key, const std::string& value,
            std::vector<Completion>& completions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // OK when (scope, key) may now hold `value_bytes` (replacing what it holds) within the limits.
  absl::Status CheckRoom(const std::string& scope, const std::string& key, size_t value_bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stores `value` at (scope, key), keeping the byte counts; returns the stored value.
  std::string& Store(const std::string& scope, const std::string& key, std::string value)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::map<std::string, std::map<std::string, std::string>> scopes_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, size_t> scope_bytes_ ABSL_GUARDED_BY(mu_);
  size_t total_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace dtrain
