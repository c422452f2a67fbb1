// hparams.yaml beside a job's metrics.csv, as Lightning's CSVLogger writes it: the job's
// resolved spec (every default filled in), in block YAML, so a run's settings travel with its
// curves and `yaml.safe_load` reads them back.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <google/protobuf/message.h>

#include "absl/status/status.h"

namespace dtrain {

// The set fields of `message` as YAML (nested messages as mappings, lists as sequences).
std::string ToYaml(const google::protobuf::Message& message);

// The model's save_hyperparameters() values as the workers report them: name and YAML flow text.
using ModelHyperParameters = std::vector<std::pair<std::string, std::string>>;

// ToYaml(spec), then, when the model recorded any, its values under `hyper_parameters:`, each
// parsed and written again: a name that is not an identifier (or is there already), or a value
// that is not what save_hyperparameters() records as a worker writes it (a quoted string, a
// number or bool, or a list of them, untagged), is left out. Every string is escaped beyond
// ASCII, so that PyYAML reads the text back. Each value left out adds a line to `left_out`
// (when given) naming it and why, for the job's log.
std::string HparamsYaml(const google::protobuf::Message& spec, const ModelHyperParameters& model,
                        std::vector<std::string>* left_out = nullptr);

// Writes HparamsYaml(spec, model, left_out) to `path` atomically; FAILED_PRECONDITION naming the
// file on failure.
absl::Status WriteHparamsFile(const std::string& path, const google::protobuf::Message& spec,
                              const ModelHyperParameters& model = {},
                              std::vector<std::string>* left_out = nullptr);

}  // namespace dtrain
