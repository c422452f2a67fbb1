// The worker's one edge with libtorch's exceptions: runs a callable and turns c10::Error (and
// other std::exceptions libtorch throws, e.g. from the TorchScript compiler) into
// INVALID_ARGUMENT carrying libtorch's message, prefixed with what was being done.
#pragma once

#include <exception>
#include <string>
#include <utility>

#include <c10/util/Exception.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace dtrain {

// As GuardTorch below, with `what` a callable that makes the prefix only on failure: the step
// path calls into libtorch several times a batch, and a prefix naming the method and the model
// would otherwise be formatted (and allocated) each time for nothing.
template <typename W, typename F>
auto GuardTorchLazy(W&& what, F&& body) -> decltype(body()) {
  try {
    return body();
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(absl::StrCat(what(), ": ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(what(), ": ", e.what()));
  }
}

// `body` returns absl::Status or absl::StatusOr<T>. `what` is a view, so that a literal past 15
// bytes is not copied into a std::string per call.
template <typename F>
auto GuardTorch(absl::string_view what, F&& body) -> decltype(body()) {
  return GuardTorchLazy([what] { return what; }, std::forward<F>(body));
}

}  // namespace dtrain
