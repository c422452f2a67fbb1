// How a step's scalar is named in the job's metrics: under its stage's prefix (train_, val_,
// test_), as dtrain's own models return "loss" and "acc", unless the model named it so already
// (a Lightning module returns or logs "val_loss"): that name is kept, not made "val_val_loss".
#pragma once

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace dtrain {

inline std::string StageMetricName(absl::string_view prefix, const std::string& name) {
  return absl::StartsWith(name, prefix) ? name : absl::StrCat(prefix, name);
}

}  // namespace dtrain
