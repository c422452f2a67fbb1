// Prometheus metrics for dtrain's daemons: counters and histograms updated where things happen,
// gauges read at scrape time from collectors, rendered in the Prometheus text exposition
// format (0.0.4). Hand-written rather than Debian's prometheus-cpp: gauges here are read from
// their owners at scrape time, which prometheus-cpp would need a custom Collectable for, and
// the format is a few lines of text (docs/decisions/operations.md).
//
// Thread-safety: all methods are safe to call concurrently.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace dtrain {

// Label pairs, e.g. {{"kind", "all_reduce"}}; rendered in this order.
using MetricLabels = std::vector<std::pair<std::string, std::string>>;

class MetricsRegistry {
 public:
  // Gauges computed at scrape time: `emit(labels, value)` once per series.
  using GaugeEmitter = std::function<void(const MetricLabels&, double)>;
  using GaugeCollector = std::function<void(const GaugeEmitter& emit)>;

  // Registers a metric's HELP text (once per name; later calls are ignored).
  void DescribeCounter(const std::string& name, const std::string& help);
  void DescribeHistogram(const std::string& name, const std::string& help,
                         std::vector<double> upper_bounds);
  // `type` is gauge, or counter for a count another component keeps.
  void AddGauge(const std::string& name, const std::string& help, GaugeCollector collector,
                const std::string& type = "gauge");

  void Increment(const std::string& name, const MetricLabels& labels, double by = 1);
  void Observe(const std::string& name, const MetricLabels& labels, double value);

  // Every metric, in the text exposition format.
  std::string Render() const;

 private:
  struct Histogram {
    std::vector<uint64_t> counts;  // per upper bound, not cumulative
    uint64_t count = 0;
    double sum = 0;
  };
  struct Family {
    std::string help;
    std::string type;                              // counter | histogram | gauge
    std::vector<double> bounds;                    // histograms
    std::map<MetricLabels, double> values;         // counters
    std::map<MetricLabels, Histogram> histograms;  // histograms
    GaugeCollector collector;                      // read at scrape time
  };

  mutable absl::Mutex mu_;
  std::map<std::string, Family> families_ ABSL_GUARDED_BY(mu_);
};

// Latency buckets in seconds, 100 µs to 100 s.
std::vector<double> LatencyBuckets();

}  // namespace dtrain
