#include "coordinator/collectives/kv_store.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace dtrain {
namespace {

constexpr size_t kMaxScope = 256;
constexpr size_t kMaxKey = 4096;
// A waiter stays on the server until its wait ends, even when its client is gone: bound it.
constexpr absl::Duration kMaxWait = absl::Hours(1);

absl::Status ValidateKey(const std::string& scope, const std::string& key) {
  if (scope.empty()) return absl::InvalidArgumentError("key-value: scope is empty");
  if (scope.size() > kMaxScope) {
    return absl::InvalidArgumentError("key-value: scope is longer than 256 bytes");
  }
  if (key.empty()) return absl::InvalidArgumentError("key-value: key is empty");
  if (key.size() > kMaxKey) {
    return absl::InvalidArgumentError(
        absl::StrCat("key-value: key is ", key.size(), " bytes; at most ", kMaxKey));
  }
  return absl::OkStatus();
}

// Below the coordinator's message limit, so the store, not gRPC, explains a refusal.
absl::Status ValidateValue(const std::string& value, size_t max) {
  if (value.size() > max) {
    return absl::InvalidArgumentError(
        absl::StrCat("key-value: value is ", value.size(), " bytes; at most ", max));
  }
  return absl::OkStatus();
}

}  // namespace

void KeyValueStore::Wake(const std::string& scope, const std::string& key, const std::string& value,
                         std::vector<Completion>& completions) {
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    if (it->scope == scope && it->key == key) {
      completions.push_back([done = std::move(it->done), value] { done(value); });
      it = waiters_.erase(it);
    } else {
      ++it;
    }
  }
}

absl::Status KeyValueStore::Set(const std::string& scope, const std::string& key,
                                std::string value) {
  if (absl::Status s = ValidateKey(scope, key); !s.ok()) return s;
  if (absl::Status s = ValidateValue(value, limits_.max_value_bytes); !s.ok()) return s;
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    DTRAIN_RETURN_IF_ERROR(CheckRoom(scope, key, value.size()));
    std::string& slot = Store(scope, key, std::move(value));
    Wake(scope, key, slot, completions);
  }
  for (Completion& c : completions) c();
  return absl::OkStatus();
}

void KeyValueStore::Get(const std::string& scope, const std::string& key, absl::Duration wait,
                        GetDone done) {
  if (absl::Status s = ValidateKey(scope, key); !s.ok()) return done(s);
  if (wait < absl::ZeroDuration() || wait > kMaxWait) {
    return done(absl::InvalidArgumentError(
        absl::StrCat("key-value: wait timeout must be between 0 and ",
                     absl::FormatDuration(kMaxWait), ", got ", absl::FormatDuration(wait))));
  }
  absl::StatusOr<std::string> answer;
  {
    absl::MutexLock lock(&mu_);
    auto sc = scopes_.find(scope);
    if (sc != scopes_.end()) {
      auto it = sc->second.find(key);
      if (it != sc->second.end()) answer = it->second;
    }
    if (!answer.ok()) {
      if (stopped_) {
        answer = absl::UnavailableError("the coordinator is shutting down");
      } else if (wait == absl::ZeroDuration()) {
        answer = absl::NotFoundError(
            absl::StrCat("key-value: no key '", key, "' in scope '", scope, "'"));
      } else {
        int in_scope = 0;
        for (const Waiter& w : waiters_) in_scope += w.scope == scope ? 1 : 0;
        if (in_scope >= limits_.scope_waiters ||
            static_cast<int>(waiters_.size()) >= limits_.total_waiters) {
          answer = absl::ResourceExhaustedError(absl::StrCat(
              "key-value: ",
              in_scope >= limits_.scope_waiters ? "scope '" + scope + "'" : "the store",
              " already has ",
              in_scope >= limits_.scope_waiters ? in_scope : static_cast<int>(waiters_.size()),
              " calls waiting for a key, its limit; wait for fewer keys at once"));
        } else {
          waiters_.push_back(Waiter{scope, key, clock_() + wait, wait, std::move(done)});
          return;
        }
      }
    }
  }
  done(std::move(answer));
}

absl::StatusOr<int64_t> KeyValueStore::Add(const std::string& scope, const std::string& key,
                                           int64_t delta) {
  if (absl::Status s = ValidateKey(scope, key); !s.ok()) return s;
  std::vector<Completion> completions;
  int64_t result = 0;
  {
    absl::MutexLock lock(&mu_);
    // Found without creating the scope: a refused add leaves nothing behind.
    const std::string* held = nullptr;
    if (auto sc = scopes_.find(scope); sc != scopes_.end()) {
      if (auto it = sc->second.find(key); it != sc->second.end()) held = &it->second;
    }
    int64_t current = 0;
    if (held != nullptr && !absl::SimpleAtoi(*held, &current)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "key-value: key '", key, "' in scope '", scope,
          "' holds a value that is not a decimal integer; add works only on counters"));
    }
    // Wrapping, like the int64 counters of torch's stores.
    result = static_cast<int64_t>(static_cast<uint64_t>(current) + static_cast<uint64_t>(delta));
    std::string text = absl::StrCat(result);
    DTRAIN_RETURN_IF_ERROR(CheckRoom(scope, key, text.size()));
    std::string& slot = Store(scope, key, std::move(text));
    Wake(scope, key, slot, completions);
  }
  for (Completion& c : completions) c();
  return result;
}

absl::StatusOr<KeyValueStore::CasResult> KeyValueStore::CompareAndSet(const std::string& scope,
                                                                      const std::string& key,
                                                                      const std::string& expected,
                                                                      std::string desired) {
  if (absl::Status s = ValidateKey(scope, key); !s.ok()) return s;
  if (absl::Status s = ValidateValue(desired, limits_.max_value_bytes); !s.ok()) return s;
  std::vector<Completion> completions;
  CasResult result;
  {
    absl::MutexLock lock(&mu_);
    // Found without creating the scope: a failed swap leaves nothing behind.
    const std::string* current = nullptr;
    if (auto sc = scopes_.find(scope); sc != scopes_.end()) {
      if (auto it = sc->second.find(key); it != sc->second.end()) current = &it->second;
    }
    const bool present = current != nullptr;
    if ((present && *current == expected) || (!present && expected.empty())) {
      DTRAIN_RETURN_IF_ERROR(CheckRoom(scope, key, desired.size()));
      std::string& slot = Store(scope, key, std::move(desired));
      result = CasResult{true, true, slot};
      Wake(scope, key, slot, completions);
    } else {
      result = CasResult{false, present, present ? *current : std::string()};
    }
  }
  for (Completion& c : completions) c();
  return result;
}

absl::StatusOr<bool> KeyValueStore::Delete(const std::string& scope, const std::string& key) {
  if (absl::Status s = ValidateKey(scope, key); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  auto sc = scopes_.find(scope);
  if (sc == scopes_.end()) return false;
  auto it = sc->second.find(key);
  if (it == sc->second.end()) return false;
  const size_t bytes = key.size() + it->second.size();
  sc->second.erase(it);
  scope_bytes_[scope] -= bytes;
  total_bytes_ -= bytes;
  if (sc->second.empty()) {
    scopes_.erase(sc);
    scope_bytes_.erase(scope);
  }
  return true;
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> KeyValueStore::List(
    const std::string& scope, const std::string& prefix, KeyPage* page) const {
  if (scope.empty()) return absl::InvalidArgumentError("key-value: scope is empty");
  std::vector<std::pair<std::string, std::string>> out;
  absl::MutexLock lock(&mu_);
  auto sc = scopes_.find(scope);
  if (sc == scopes_.end()) return out;
  auto it = sc->second.lower_bound(prefix);
  if (page != nullptr && page->resumes() && page->after() >= prefix) {
    it = sc->second.upper_bound(page->after());
  }
  for (; it != sc->second.end() && absl::StartsWith(it->first, prefix); ++it) {
    // An entry's encoded size: its key, its value and a few bytes of framing.
    if (page != nullptr && !page->Take(it->first, it->first.size() + it->second.size() + 16)) {
      break;
    }
    out.emplace_back(it->first, it->second);
  }
  return out;
}

void KeyValueStore::DeleteScope(const std::string& scope) {
  absl::MutexLock lock(&mu_);
  scopes_.erase(scope);
  auto it = scope_bytes_.find(scope);
  if (it != scope_bytes_.end()) {
    total_bytes_ -= it->second;
    scope_bytes_.erase(it);
  }
}

absl::Status KeyValueStore::CheckRoom(const std::string& scope, const std::string& key,
                                      size_t value_bytes) {
  size_t old_bytes = 0;
  size_t keys = 0;
  auto sc = scopes_.find(scope);
  if (sc != scopes_.end()) {
    keys = sc->second.size();
    auto it = sc->second.find(key);
    if (it != sc->second.end()) old_bytes = key.size() + it->second.size();
  }
  const size_t new_bytes = key.size() + value_bytes;
  if (old_bytes == 0 && keys >= limits_.scope_keys) {
    return absl::ResourceExhaustedError(absl::StrCat("key-value: scope '", scope, "' holds ", keys,
                                                     " keys, its limit; delete some first"));
  }
  auto held = scope_bytes_.find(scope);
  const size_t in_scope = held == scope_bytes_.end() ? 0 : held->second;
  if (in_scope - old_bytes + new_bytes > limits_.scope_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("key-value: scope '", scope, "' holds ", in_scope, " bytes; ", new_bytes,
                     " more would pass its limit of ", limits_.scope_bytes,
                     " (the store is for rendezvous data, not payloads)"));
  }
  if (total_bytes_ - old_bytes + new_bytes > limits_.total_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("key-value: the store holds ", total_bytes_, " bytes; ", new_bytes,
                     " more would pass its limit of ", limits_.total_bytes));
  }
  return absl::OkStatus();
}

std::string& KeyValueStore::Store(const std::string& scope, const std::string& key,
                                  std::string value) {
  auto& entries = scopes_[scope];
  auto [it, created] = entries.try_emplace(key);
  std::string& slot = it->second;
  const size_t old_bytes = created ? 0 : key.size() + slot.size();
  const size_t new_bytes = key.size() + value.size();
  scope_bytes_[scope] += new_bytes - old_bytes;
  total_bytes_ += new_bytes - old_bytes;
  slot = std::move(value);
  return slot;
}

bool KeyValueStore::Tick(absl::Time now) {
  std::vector<Completion> completions;
  bool waiting = false;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if (now < it->deadline) {
        ++it;
        continue;
      }
      completions.push_back(
          [done = std::move(it->done),
           msg = absl::StrCat("key-value: key '", it->key, "' in scope '", it->scope,
                              "' was not set within ", absl::FormatDuration(it->wait))] {
            done(absl::DeadlineExceededError(msg));
          });
      it = waiters_.erase(it);
    }
    waiting = !waiters_.empty();
  }
  for (Completion& c : completions) c();
  return waiting;
}

void KeyValueStore::Stop() {
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
    for (Waiter& w : waiters_) {
      completions.push_back([done = std::move(w.done)] {
        done(absl::UnavailableError("the coordinator is shutting down"));
      });
    }
    waiters_.clear();
  }
  for (Completion& c : completions) c();
}

int KeyValueStore::WaitingGets() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(waiters_.size());
}

}  // namespace dtrain
