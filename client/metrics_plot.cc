#include "client/metrics_plot.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dtrain {
namespace {

constexpr double kPanelWidth = 460, kPanelHeight = 300, kMargin = 50;
const char* const kColors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd"};

std::string Escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '<')
      out += "&lt;";
    else if (c == '>')
      out += "&gt;";
    else if (c == '&')
      out += "&amp;";
    else
      out += c;
  }
  return out;
}

// One panel at x offset `left`: axes, ticks, one polyline (or dot) per series, a legend.
std::string Panel(double left, const std::string& heading,
                  const std::map<std::string, std::vector<std::pair<double, double>>>& series) {
  std::string svg;
  const double x0 = left + kMargin, y0 = 40, w = kPanelWidth - kMargin - 10, h = kPanelHeight - 70;
  absl::StrAppend(
      &svg, absl::StrFormat("<text x='%.0f' y='28' font-size='14' font-weight='bold'>%s</text>\n",
                            x0, Escape(heading)));
  if (series.empty()) {
    absl::StrAppend(&svg, absl::StrFormat("<text x='%.0f' y='%.0f' font-size='12'>no data</text>\n",
                                          x0 + 10, y0 + h / 2));
    return svg;
  }
  double min_x = INFINITY, max_x = -INFINITY, min_y = INFINITY, max_y = -INFINITY;
  for (const auto& [name, points] : series) {
    for (const auto& [x, y] : points) {
      min_x = std::min(min_x, x);
      max_x = std::max(max_x, x);
      min_y = std::min(min_y, y);
      max_y = std::max(max_y, y);
    }
  }
  if (max_x == min_x) max_x = min_x + 1;
  if (max_y == min_y) {
    max_y += 0.5;
    min_y -= 0.5;
  }
  const double pad = (max_y - min_y) * 0.05;
  min_y -= pad;
  max_y += pad;
  auto sx = [&](double x) { return x0 + (x - min_x) / (max_x - min_x) * w; };
  auto sy = [&](double y) { return y0 + h - (y - min_y) / (max_y - min_y) * h; };
  absl::StrAppend(
      &svg, absl::StrFormat(
                "<rect x='%.1f' y='%.1f' width='%.1f' height='%.1f' fill='none' stroke='#444'/>\n",
                x0, y0, w, h));
  for (int i = 0; i <= 4; ++i) {
    const double y = min_y + (max_y - min_y) * i / 4;
    absl::StrAppend(
        &svg,
        absl::StrFormat("<line x1='%.1f' x2='%.1f' y1='%.1f' y2='%.1f' stroke='#ddd'/>"
                        "<text x='%.1f' y='%.1f' font-size='10' text-anchor='end'>%.3g</text>\n",
                        x0, x0 + w, sy(y), sy(y), x0 - 4, sy(y) + 3, y));
    const double x = min_x + (max_x - min_x) * i / 4;
    absl::StrAppend(
        &svg,
        absl::StrFormat("<text x='%.1f' y='%.1f' font-size='10' text-anchor='middle'>%.0f</text>\n",
                        sx(x), y0 + h + 14, x));
  }
  absl::StrAppend(
      &svg,
      absl::StrFormat("<text x='%.1f' y='%.1f' font-size='11' text-anchor='middle'>step</text>\n",
                      x0 + w / 2, y0 + h + 30));
  int color = 0;
  for (const auto& [name, points] : series) {
    const char* c = kColors[color % 5];
    std::string coords;
    for (const auto& [x, y] : points)
      absl::StrAppend(&coords, absl::StrFormat("%.1f,%.1f ", sx(x), sy(y)));
    if (points.size() > 1) {
      absl::StrAppend(
          &svg,
          absl::StrFormat("<polyline fill='none' stroke='%s' stroke-width='1.5' points='%s'/>\n", c,
                          coords));
    }
    for (const auto& [x, y] : points) {
      if (points.size() <= 50) {
        absl::StrAppend(&svg, absl::StrFormat("<circle cx='%.1f' cy='%.1f' r='2.5' fill='%s'/>\n",
                                              sx(x), sy(y), c));
      }
    }
    absl::StrAppend(
        &svg, absl::StrFormat("<rect x='%.1f' y='%.1f' width='10' height='10' fill='%s'/>"
                              "<text x='%.1f' y='%.1f' font-size='11'>%s (last %.4g)</text>\n",
                              x0 + 8, y0 + 8 + 16 * color, c, x0 + 22, y0 + 17 + 16 * color,
                              Escape(name), points.back().second));
    ++color;
  }
  return svg;
}

}  // namespace

std::string MetricsSvg(const std::string& title, const std::vector<v1::MetricPoint>& points) {
  std::map<std::string, std::vector<std::pair<double, double>>> losses, accuracies;
  for (const v1::MetricPoint& p : points) {
    if (!std::isfinite(p.value())) continue;
    auto& panel = absl::StrContains(p.name(), "acc") ? accuracies : losses;
    panel[p.name()].emplace_back(static_cast<double>(p.step()), p.value());
  }
  std::string svg = absl::StrFormat(
      "<svg xmlns='http://www.w3.org/2000/svg' width='%.0f' height='%.0f' "
      "font-family='sans-serif'>\n<rect width='100%%' height='100%%' fill='white'/>\n"
      "<text x='10' y='14' font-size='12' fill='#555'>%s</text>\n",
      2 * kPanelWidth, kPanelHeight, Escape(title));
  absl::StrAppend(&svg, Panel(0, "loss", losses), Panel(kPanelWidth, "accuracy", accuracies));
  absl::StrAppend(&svg, "</svg>\n");
  return svg;
}

absl::Status WriteMetricsPlot(const std::string& path, const std::string& title,
                              const std::vector<v1::MetricPoint>& points) {
  if (!absl::EndsWith(path, ".svg")) {
    return absl::InvalidArgumentError(
        absl::StrCat("--plot writes SVG; give a file name ending in .svg, got '", path, "'"));
  }
  std::ofstream out(path, std::ios::trunc);
  out << MetricsSvg(title, points);
  if (!out) return absl::FailedPreconditionError(absl::StrCat("cannot write '", path, "'"));
  return absl::OkStatus();
}

}  // namespace dtrain
