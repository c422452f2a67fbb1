// libFuzzer target: the job-spec path every submission takes: the YAML/JSON file parser that
// maps keys onto JobSpec by protobuf reflection (client side), then the value rules the
// coordinator applies to every SubmitJob (NormalizeJobSpec), then the checkpoint filename the
// accepted spec's template gives. Any crash, sanitizer report, a normalized spec that the rules
// then refuse (they must be idempotent), or a file name with a '/' is a finding. Built and run
// by tests/fuzz/run.sh.
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>

#include "client/job_spec_file.h"
#include "common/checkpoint_filename.h"
#include "common/job_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<dtrain::v1::JobSpec> spec = dtrain::ParseJobSpec(text);
  if (!spec.ok()) return 0;
  dtrain::v1::JobSpec normalized = *spec;
  if (!dtrain::NormalizeJobSpec(&normalized).ok()) return 0;
  dtrain::v1::JobSpec twice = normalized;
  if (!dtrain::NormalizeJobSpec(&twice).ok()) std::abort();
  const std::map<std::string, double> values = {
      {"epoch", 3}, {"step", -12}, {"val_loss", 1e300}, {"x/y", -0.0}};
  for (bool insert : {true, false}) {
    const std::string name =
        dtrain::FormatCheckpointFilename(normalized.checkpoint().filename(), values, insert);
    if (name.find('/') != std::string::npos || name == ".ckpt") std::abort();
  }
  return 0;
}
