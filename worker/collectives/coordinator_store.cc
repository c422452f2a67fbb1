#include "worker/collectives/coordinator_store.h"

#include <algorithm>

#include <c10/util/Exception.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace dtrain {
namespace {

std::string AsString(const std::vector<uint8_t>& bytes) {
  return std::string(bytes.begin(), bytes.end());
}

std::vector<uint8_t> AsBytes(const std::string& text) {
  return std::vector<uint8_t>(text.begin(), text.end());
}

void Check(const absl::Status& status, const std::string& what) {
  TORCH_CHECK(status.ok(), "coordinator store ", what, ": ", status.ToString());
}

// The coordinator caps one key-value wait at an hour; longer waits are made of several.
constexpr absl::Duration kMaxWait = absl::Minutes(59);

}  // namespace

CoordinatorStore::CoordinatorStore(std::shared_ptr<KeyValueClient> client,
                                   std::chrono::milliseconds timeout,
                                   std::chrono::milliseconds min_wait)
    : Store(timeout), client_(std::move(client)), min_wait_(min_wait) {}

void CoordinatorStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  Check(client_->Set(key, AsString(value)), absl::StrCat("set '", key, "'"));
}

std::vector<uint8_t> CoordinatorStore::compareSet(const std::string& key,
                                                  const std::vector<uint8_t>& expected,
                                                  const std::vector<uint8_t>& desired) {
  absl::StatusOr<KeyValueClient::CasResult> result =
      client_->CompareAndSet(key, AsString(expected), AsString(desired));
  Check(result.status(), absl::StrCat("compare_set '", key, "'"));
  // As c10d: the value now held (the desired one when swapped).
  return AsBytes(result->swapped ? AsString(desired) : result->value);
}

std::vector<uint8_t> CoordinatorStore::get(const std::string& key) {
  wait({key});
  absl::StatusOr<std::string> value = client_->Get(key);
  Check(value.status(), absl::StrCat("get '", key, "'"));
  return AsBytes(*value);
}

int64_t CoordinatorStore::add(const std::string& key, int64_t value) {
  absl::StatusOr<int64_t> result = client_->Add(key, value);
  Check(result.status(), absl::StrCat("add '", key, "'"));
  return *result;
}

bool CoordinatorStore::deleteKey(const std::string& key) {
  absl::StatusOr<bool> deleted = client_->Delete(key);
  Check(deleted.status(), absl::StrCat("delete '", key, "'"));
  return *deleted;
}

bool CoordinatorStore::check(const std::vector<std::string>& keys) {
  for (const std::string& key : keys) {
    absl::StatusOr<std::string> value = client_->Get(key);
    if (value.status().code() == absl::StatusCode::kNotFound) return false;
    Check(value.status(), absl::StrCat("check '", key, "'"));
  }
  return true;
}

int64_t CoordinatorStore::getNumKeys() {
  auto entries = client_->List();
  Check(entries.status(), "list");
  return static_cast<int64_t>(entries->size());
}

void CoordinatorStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void CoordinatorStore::wait(const std::vector<std::string>& keys,
                            const std::chrono::milliseconds& asked) {
  const bool forever = asked == kNoTimeout;
  const std::chrono::milliseconds timeout = forever ? asked : std::max(asked, min_wait_);
  const absl::Time deadline = absl::Now() + absl::FromChrono(timeout);
  for (const std::string& key : keys) {
    while (true) {
      const absl::Duration left = forever ? kMaxWait : std::min(kMaxWait, deadline - absl::Now());
      TORCH_CHECK(left > absl::ZeroDuration(), "coordinator store: timed out after ",
                  timeout.count(), " ms waiting for key '", key, "'");
      absl::StatusOr<std::string> value = client_->Get(key, left);
      if (value.ok()) break;
      if (value.status().code() == absl::StatusCode::kDeadlineExceeded &&
          (forever || absl::Now() < deadline)) {
        continue;
      }
      TORCH_CHECK(value.status().code() != absl::StatusCode::kDeadlineExceeded,
                  "coordinator store: timed out after ", timeout.count(), " ms waiting for key '",
                  key, "'");
      Check(value.status(), absl::StrCat("wait for '", key, "'"));
    }
  }
}

}  // namespace dtrain
