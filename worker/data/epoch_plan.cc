#include "worker/data/epoch_plan.h"

#include <algorithm>
#include <numeric>

namespace dtrain {

uint64_t MixSeed(std::initializer_list<uint64_t> parts) {
  uint64_t h = 0x9e3779b97f4a7c15ULL;
  for (uint64_t p : parts) {
    h ^= p + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    // splitmix64's finalizer
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ULL;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebULL;
    h ^= h >> 31;
  }
  return h;
}

uint64_t UniformBelow(std::mt19937_64& rng, uint64_t n) {
  if (n <= 1) return 0;
  const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  uint64_t x;
  do {
    x = rng();
  } while (x >= limit);
  return x % n;
}

int64_t RankEpochSamples(int64_t total, int world, int rank, bool training) {
  if (world < 1 || rank < 0 || rank >= world || total <= 0) return 0;
  if (training) return total / world;
  return (total - rank + world - 1) / world;
}

std::vector<int64_t> EpochShardOrder(int64_t shards, bool shuffle, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> order(static_cast<size_t>(std::max<int64_t>(shards, 0)));
  std::iota(order.begin(), order.end(), 0);
  if (!shuffle) return order;
  std::mt19937_64 rng(MixSeed({seed, static_cast<uint64_t>(epoch), 0x5348415244ULL}));
  for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[UniformBelow(rng, i)]);
  return order;
}

std::vector<ShardSegment> PlanRankEpoch(const EpochPlanInput& in) {
  int64_t total = 0;
  for (int64_t n : in.shard_samples) total += std::max<int64_t>(n, 0);
  const int64_t take = RankEpochSamples(total, in.world, in.rank, in.training);
  int64_t start = 0;
  if (in.training) {
    start = static_cast<int64_t>(in.rank) * take;
  } else {
    for (int r = 0; r < in.rank; ++r) start += RankEpochSamples(total, in.world, r, false);
  }
  const std::vector<int64_t> order = EpochShardOrder(static_cast<int64_t>(in.shard_samples.size()),
                                                     in.training && in.shuffle, in.seed, in.epoch);
  std::vector<ShardSegment> segments;
  int64_t at = 0;  // the virtual sequence's position at the current shard's first sample
  int64_t left = take;
  for (int64_t shard : order) {
    if (left == 0) break;
    const int64_t n = std::max<int64_t>(in.shard_samples[shard], 0);
    if (at + n > start && n > 0) {
      const int64_t skip = std::max<int64_t>(start - at, 0);
      const int64_t here = std::min(n - skip, left);
      segments.push_back({shard, skip, here});
      left -= here;
    }
    at += n;
  }
  return segments;
}

}  // namespace dtrain
