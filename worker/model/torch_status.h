// The worker's one edge with libtorch's exceptions: runs a callable and turns c10::Error (and
// other std::exceptions libtorch throws, e.g. from the TorchScript compiler) into
// INVALID_ARGUMENT carrying libtorch's message, prefixed with what was being done.
#pragma once

#include <exception>
#include <string>

#include <c10/util/Exception.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace dtrain {

// `body` returns absl::Status or absl::StatusOr<T>.
template <typename F>
auto GuardTorch(const std::string& what, F&& body) -> decltype(body()) {
  try {
    return body();
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", e.what()));
  }
}

}  // namespace dtrain
