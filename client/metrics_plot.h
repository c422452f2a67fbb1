// `dtrain results JOB --plot FILE.svg`: the job's curves as an SVG image, two panels side by
// side: losses (train_loss, val_loss, test_loss) and accuracies (val_acc, test_acc) against the
// global step. Hand-written SVG: Debian has no C++ plotting library worth a dependency, and an
// SVG of polylines is a few dozen lines.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "dtrain/v1/jobs.pb.h"

namespace dtrain {

std::string MetricsSvg(const std::string& title, const std::vector<v1::MetricPoint>& points);
// INVALID_ARGUMENT unless the path ends in .svg; FAILED_PRECONDITION when it cannot be written.
absl::Status WriteMetricsPlot(const std::string& path, const std::string& title,
                              const std::vector<v1::MetricPoint>& points);

}  // namespace dtrain
