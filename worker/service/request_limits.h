// Bounds on what a job RPC may carry in its named values (monitored metrics, callback states).
// The coordinator sends a few; a request is bounded before a job reads it, whoever sent it.
#pragma once

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace dtrain {

inline constexpr int kMaxNamedValues = 256;
inline constexpr size_t kMaxNameBytes = 256;

// INVALID_ARGUMENT naming `field` when `values` (a map keyed by name) holds more than
// kMaxNamedValues entries or a name longer than kMaxNameBytes.
template <typename Map>
absl::Status CheckNames(const std::string& field, const Map& values) {
  if (static_cast<int>(values.size()) > kMaxNamedValues) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", values.size(), " entries; at most ", kMaxNamedValues));
  }
  for (const auto& entry : values) {
    if (entry.first.size() > kMaxNameBytes) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": a name of ", entry.first.size(),
                                                     " bytes; at most ", kMaxNameBytes));
    }
  }
  return absl::OkStatus();
}

// The same bounds on SaveCheckpointRequest.callbacks (CallbackState messages: a key and three
// maps of named values): at most kMaxNamedValues states, keys and names of at most
// kMaxNameBytes.
template <typename States>
absl::Status CheckCallbackStates(const States& states) {
  if (static_cast<int>(states.size()) > kMaxNamedValues) {
    return absl::InvalidArgumentError(
        absl::StrCat("callbacks: ", states.size(), " states; at most ", kMaxNamedValues));
  }
  for (const auto& state : states) {
    const std::string at = absl::StrCat("callbacks['", state.key().substr(0, 64), "']");
    if (state.key().size() > kMaxNameBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(at, ": key of ", state.key().size(), " bytes; at most ", kMaxNameBytes));
    }
    DTRAIN_RETURN_IF_ERROR(CheckNames(at + ".ints", state.ints()));
    DTRAIN_RETURN_IF_ERROR(CheckNames(at + ".floats", state.floats()));
    DTRAIN_RETURN_IF_ERROR(CheckNames(at + ".tensors", state.tensors()));
  }
  return absl::OkStatus();
}

}  // namespace dtrain
