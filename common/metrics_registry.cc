#include "common/metrics_registry.h"

#include <cmath>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"

namespace dtrain {
namespace {

std::string Escape(const std::string& value) {
  return absl::StrReplaceAll(value, {{"\\", "\\\\"}, {"\"", "\\\""}, {"\n", "\\n"}});
}

std::string Labels(const MetricLabels& labels, const std::string& extra_name = "",
                   const std::string& extra_value = "") {
  std::vector<std::string> parts;
  for (const auto& [name, value] : labels)
    parts.push_back(absl::StrCat(name, "=\"", Escape(value), "\""));
  if (!extra_name.empty()) parts.push_back(absl::StrCat(extra_name, "=\"", extra_value, "\""));
  if (parts.empty()) return "";
  std::string out = "{";
  for (size_t i = 0; i < parts.size(); ++i) absl::StrAppend(&out, i == 0 ? "" : ",", parts[i]);
  return out + "}";
}

std::string Number(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (std::isnan(v)) return "NaN";
  // Counts and byte totals exactly (StrCat's 6 significant digits would print 2869683 bytes as
  // 2.86968e+06); other values to full precision, which Prometheus parses alike.
  if (v == std::floor(v) && std::fabs(v) < 9007199254740992.0) {
    return absl::StrCat(static_cast<int64_t>(v));
  }
  // The shortest of 15 or 17 digits that reads back as `v` (0.1 stays "0.1").
  std::string shorter = absl::StrFormat("%.15g", v);
  return std::strtod(shorter.c_str(), nullptr) == v ? shorter : absl::StrFormat("%.17g", v);
}

}  // namespace

std::vector<double> LatencyBuckets() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
          0.25,   0.5,     1,      2.5,   5,      10,    25,   50,    100};
}

void MetricsRegistry::DescribeCounter(const std::string& name, const std::string& help) {
  absl::MutexLock lock(&mu_);
  Family& f = families_[name];
  if (!f.type.empty()) return;
  f.help = help;
  f.type = "counter";
}

void MetricsRegistry::DescribeHistogram(const std::string& name, const std::string& help,
                                        std::vector<double> upper_bounds) {
  absl::MutexLock lock(&mu_);
  Family& f = families_[name];
  if (!f.type.empty()) return;
  f.help = help;
  f.type = "histogram";
  f.bounds = std::move(upper_bounds);
}

void MetricsRegistry::AddGauge(const std::string& name, const std::string& help,
                               GaugeCollector collector, const std::string& type) {
  absl::MutexLock lock(&mu_);
  Family& f = families_[name];
  f.help = help;
  f.type = type;
  f.collector = std::move(collector);
}

void MetricsRegistry::Increment(const std::string& name, const MetricLabels& labels, double by) {
  absl::MutexLock lock(&mu_);
  families_[name].values[labels] += by;
}

void MetricsRegistry::Observe(const std::string& name, const MetricLabels& labels, double value) {
  absl::MutexLock lock(&mu_);
  Family& f = families_[name];
  Histogram& h = f.histograms[labels];
  if (h.counts.size() != f.bounds.size()) h.counts.assign(f.bounds.size(), 0);
  for (size_t i = 0; i < f.bounds.size(); ++i) {
    if (value <= f.bounds[i]) {
      ++h.counts[i];
      break;
    }
  }
  ++h.count;
  h.sum += value;
}

std::string MetricsRegistry::Render() const {
  // Collectors run outside the lock: they take other components' locks.
  struct Read {
    std::string help, type;
    GaugeCollector collector;
  };
  std::map<std::string, Read> gauges;
  std::string out;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, f] : families_) {
      if (f.collector) {
        gauges[name] = {f.help, f.type, f.collector};
        continue;
      }
      absl::StrAppend(&out, "# HELP ", name, " ", f.help, "\n# TYPE ", name, " ",
                      f.type.empty() ? "untyped" : f.type, "\n");
      for (const auto& [labels, value] : f.values) {
        absl::StrAppend(&out, name, Labels(labels), " ", Number(value), "\n");
      }
      for (const auto& [labels, h] : f.histograms) {
        uint64_t cumulative = 0;
        for (size_t i = 0; i < f.bounds.size(); ++i) {
          cumulative += i < h.counts.size() ? h.counts[i] : 0;
          absl::StrAppend(&out, name, "_bucket", Labels(labels, "le", Number(f.bounds[i])), " ",
                          cumulative, "\n");
        }
        absl::StrAppend(&out, name, "_bucket", Labels(labels, "le", "+Inf"), " ", h.count, "\n");
        absl::StrAppend(&out, name, "_sum", Labels(labels), " ", Number(h.sum), "\n");
        absl::StrAppend(&out, name, "_count", Labels(labels), " ", h.count, "\n");
      }
    }
  }
  for (const auto& [gauge, read] : gauges) {
    // A structured binding cannot be captured in C++17: name the gauge for the lambda.
    const std::string& name = gauge;
    absl::StrAppend(&out, "# HELP ", name, " ", read.help, "\n# TYPE ", name, " ", read.type, "\n");
    read.collector([&](const MetricLabels& labels, double value) {
      absl::StrAppend(&out, name, Labels(labels), " ", Number(value), "\n");
    });
  }
  return out;
}

}  // namespace dtrain
