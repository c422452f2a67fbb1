// The dashboard's files, embedded in the coordinator at build time (cmake/embed_assets.cmake):
// index.html, login.html, app.js, login.js, app.css from coordinator/web/static/, and chart.js,
// Chart.js as Debian's libjs-chart.js ships it. No CDN, no files beside the binary.
#pragma once

#include <string>

namespace dtrain {

// The file's bytes; empty for an unknown name.
const std::string& DashboardAsset(const std::string& name);

}  // namespace dtrain
