// Lightning's ModelCheckpoint filename templates ("{epoch}-{val_loss:.2f}"): checked when a job
// is submitted, formatted when a checkpoint is written. A field is {name} or {name:spec}, where
// spec is the part of Python's format mini-language that numbers use here: an optional 0 and
// width, an optional .precision, and a type among d, f, e, g. With auto_insert_metric_name, as
// in Lightning, {val_loss} becomes "val_loss=<value>". A metric the template names but the run
// has not logged formats as 0, as Lightning does.
#pragma once

#include <map>
#include <string>

#include "absl/status/status.h"

namespace dtrain {

// INVALID_ARGUMENT naming the problem: unbalanced braces, an empty or unreadable field, a spec
// outside the subset, a leading '.', "..", or outside the fields a character other than
// letters, digits, '.', '_', '=' and '-' (what a worker accepts as a checkpoint's name).
absl::Status ValidateCheckpointFilename(const std::string& pattern);

// The file name (".ckpt" added) for a pattern ValidateCheckpointFilename accepted; "" is
// Lightning's default "{epoch}-{step}". `values` holds epoch, step and the metrics. A character
// a checkpoint's name cannot hold ('/' of a metric's name, '+' of an exponent) becomes '_'.
std::string FormatCheckpointFilename(const std::string& pattern,
                                     const std::map<std::string, double>& values,
                                     bool auto_insert_metric_name);

}  // namespace dtrain
