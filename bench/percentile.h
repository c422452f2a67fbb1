// The benches' one percentile: the nearest-rank value of a sample, so that every bench's p50 and
// p99 mean the same thing. An empty sample gives 0, which the benches print as "nothing measured".
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

namespace dtrain::bench {

// `fraction` in [0, 1]: 0.5 the median, 0.99 the 99th percentile.
inline double Percentile(std::vector<double> sample, double fraction) {
  if (sample.empty()) return 0;
  std::sort(sample.begin(), sample.end());
  const double at = fraction * static_cast<double>(sample.size() - 1) + 0.5;
  return sample[std::min(sample.size() - 1, static_cast<size_t>(at))];
}

}  // namespace dtrain::bench
