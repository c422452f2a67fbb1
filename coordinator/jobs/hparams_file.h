// hparams.yaml beside a job's metrics.csv, as Lightning's CSVLogger writes it: the job's
// resolved spec (every default filled in), in block YAML, so a run's settings travel with its
// curves and `yaml.safe_load` reads them back.
#pragma once

#include <string>

#include <google/protobuf/message.h>

#include "absl/status/status.h"

namespace dtrain {

// The set fields of `message` as YAML (nested messages as mappings, lists as sequences).
std::string ToYaml(const google::protobuf::Message& message);

// Writes ToYaml(spec) to `path` atomically; FAILED_PRECONDITION naming the file on failure.
absl::Status WriteHparamsFile(const std::string& path, const google::protobuf::Message& spec);

}  // namespace dtrain
