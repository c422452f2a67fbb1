// Reads a job spec file (YAML, or JSON, which is YAML too) into a JobSpec. yaml-cpp parses the
// file; protobuf's reflection maps its keys onto the message, so the file's layout is the
// proto's (LightningCLI's sections) and an unknown key or a value of the wrong type is
// refused with its path: "trainer.max_epoch: unknown key; trainer has max_epochs, max_steps, ...".
// The spec's values are then checked by NormalizeJobSpec (common/job_spec.h).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "dtrain/v1/jobs.pb.h"

namespace dtrain {

// NOT_FOUND: no file. INVALID_ARGUMENT: a syntax error (with line and column), an unknown
// key, a value of the wrong type, or two choices of one oneof (e.g. model.builtin and
// model.torchscript).
// Relative paths in the file (model.torchscript, data.tensors_file, data.data_dir,
// resume_from, checkpoint.dirpath) are made absolute against the file's own directory, as a
// compose file's are: the workers do not share the client's working directory.
absl::StatusOr<v1::JobSpec> ReadJobSpecFile(const std::string& path);
// The same resolution against `base`.
void ResolvePaths(const std::string& base, v1::JobSpec* spec);
absl::StatusOr<v1::JobSpec> ParseJobSpec(const std::string& text);

}  // namespace dtrain
