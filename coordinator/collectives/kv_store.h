// KeyValueStore: the coordinator's scoped key-value store, the rendezvous store other engines
// (Gloo's, c10d's) can build on. Scopes are usually group ids; a scope is deleted when its
// group's last member leaves.
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

namespace dtrain {

class KeyValueStore {
 public:
  using GetDone = std::function<void(absl::StatusOr<std::string>)>;
  struct CasResult {
    bool swapped = false;
    bool present = false;
    std::string value;
  };

  // `clock` stamps waits' deadlines (Tick expires them).
  explicit KeyValueStore(Clock clock = absl::Now) : clock_(std::move(clock)) {}

  // INVALID_ARGUMENT on an empty or oversized scope, key or value.
  absl::Status Set(const std::string& scope, const std::string& key, std::string value);

  // Answers at once if present; NOT_FOUND if absent and `wait` is zero; otherwise waits up to
  // `wait` for a writer, then DEADLINE_EXCEEDED.
  void Get(const std::string& scope, const std::string& key, absl::Duration wait, GetDone done);

  // FAILED_PRECONDITION if the stored value is not a decimal int64.
  absl::StatusOr<int64_t> Add(const std::string& scope, const std::string& key, int64_t delta);

  absl::StatusOr<CasResult> CompareAndSet(const std::string& scope, const std::string& key,
                                          const std::string& expected, std::string desired);

  absl::StatusOr<bool> Delete(const std::string& scope, const std::string& key);

  // Sorted by key.
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> List(
      const std::string& scope, const std::string& prefix) const;

  void DeleteScope(const std::string& scope);

  // Fails Get waiters whose wait ran out.
  void Tick(absl::Time now);
  // Fails every waiter with UNAVAILABLE.
  void Stop();
  // Get calls waiting for a writer now (for tests: the moment a reader waits is observable).
  int WaitingGets() const;

 private:
  const Clock clock_;
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

  mutable absl::Mutex mu_;
  std::map<std::string, std::map<std::string, std::string>> scopes_ ABSL_GUARDED_BY(mu_);
  std::vector<Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace dtrain
