// Reads a job spec file (YAML, or JSON, which is YAML too) into a JobSpec. yaml-cpp parses the
// file; protobuf's reflection maps its keys onto the message, so the file's layout is the
// proto's (LightningCLI's sections) and an unknown key or a value of the wrong type is
// refused with its path: "trainer.max_epoch: unknown key; trainer has max_epochs, max_steps, ...",
// and a key a setting replaced with its hint (the Setting options, common/job_settings.h).
// The spec's values are then checked by NormalizeJobSpec (common/job_spec.h).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "dtrain/v1/jobs.pb.h"

namespace dtrain {

// One spec's text. INVALID_ARGUMENT: a syntax error (with line and column), an unknown key, a
// value of the wrong type, or two choices of one oneof (e.g. model.builtin and
// model.torchscript). Paths are left as written.
absl::StatusOr<v1::JobSpec> ParseJobSpec(const std::string& text);

// LightningCLI's way: each --config file in order, then each --section.key=value override,
// onto one spec; later values win (a list is replaced whole). NOT_FOUND: no such file. A
// file's relative paths (the fields whose Setting option says they are paths: model.torchscript,
// data.tensors_file, ...) resolve against its own directory, as a compose file's do, an
// override's against the working directory; marked paths (common/file_reference.h) stay. Errors
// name the file or the override and the key's path. The stage is the subcommand: a `stage` key is
// refused with that hint.
absl::StatusOr<v1::JobSpec> ReadJobConfig(
    const std::vector<std::string>& files,
    const std::vector<std::pair<std::string, std::string>>& overrides);
// Sets one dotted key from YAML text: ApplyOverride("trainer.max_epochs", "5", &spec).
absl::Status ApplyOverride(const std::string& dotted, const std::string& value, v1::JobSpec* spec);
// The spec as a config file that ReadJobConfig reads back to the same spec (--print_config);
// without `stage`.
std::string JobSpecToYaml(const v1::JobSpec& spec);

}  // namespace dtrain
