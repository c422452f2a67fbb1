#include "common/distributed_sampler.h"

#include <algorithm>
#include <numeric>
#include <random>
#include <utility>

namespace dtrain {
namespace {

// A draw uniform in [0, bound), bound >= 1: the high half of the engine's output times bound,
// with the 2^64 mod bound products that would favour some results drawn again (Lemire's
// multiply-and-reject, hand-written: no C++ library fixes its uniform_int_distribution's steps).
// A division only on the rare draws that land near the rejection threshold, so an epoch's
// shuffle of ~60,000 costs about as much as std::shuffle's.
uint64_t UniformBelow(std::mt19937_64& engine, uint64_t bound) {
  using Wide = unsigned __int128;
  Wide product = static_cast<Wide>(engine()) * bound;
  uint64_t low = static_cast<uint64_t>(product);
  if (low < bound) {
    const uint64_t threshold = (0 - bound) % bound;  // 2^64 mod bound
    while (low < threshold) {
      product = static_cast<Wide>(engine()) * bound;
      low = static_cast<uint64_t>(product);
    }
  }
  return static_cast<uint64_t>(product >> 64);
}

}  // namespace

std::vector<int64_t> TrainShard(int64_t n, int world, int rank, bool shuffle, uint64_t seed,
                                int64_t epoch) {
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  if (shuffle) {
    // One generator seeded by seed and epoch: every rank's shard comes from the same
    // permutation, and each epoch has its own.
    std::mt19937_64 generator(seed * 1000003u + static_cast<uint64_t>(epoch));
    for (int64_t i = n - 1; i > 0; --i) {
      std::swap(order[i], order[UniformBelow(generator, static_cast<uint64_t>(i) + 1)]);
    }
  }
  const int64_t per_rank = (n + world - 1) / world;
  const int64_t total = per_rank * world;
  for (int64_t i = n; i < total; ++i) order.push_back(order[(i - n) % n]);
  std::vector<int64_t> mine;
  mine.reserve(per_rank);
  for (int64_t i = rank; i < total; i += world) mine.push_back(order[i]);
  return mine;
}

std::vector<int64_t> TrainIndices(int64_t n, int world, int rank, bool streamed, bool shuffle,
                                  uint64_t seed, int64_t epoch) {
  return streamed ? StreamPositions(n, world, rank, true)
                  : TrainShard(n, world, rank, shuffle, seed, epoch);
}

std::vector<int64_t> StreamPositions(int64_t n, int world, int rank, bool training) {
  if (world < 1 || rank < 0 || rank >= world || n <= 0) return {};
  const int64_t count = training ? n / world : (n - rank + world - 1) / world;
  std::vector<int64_t> positions(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) positions[i] = i;
  return positions;
}

int64_t StreamEvalOffset(int64_t n, int world, int rank) {
  int64_t offset = 0;
  for (int r = 0; r < rank && r < world; ++r) offset += (n - r + world - 1) / world;
  return offset;
}

std::vector<int64_t> EvalShard(int64_t n, int world, int rank) {
  std::vector<int64_t> mine;
  for (int64_t i = rank; i < n; i += world) mine.push_back(i);
  return mine;
}

std::vector<std::vector<int64_t>> Batches(const std::vector<int64_t>& indices, int batch_size) {
  std::vector<std::vector<int64_t>> out;
  for (size_t i = 0; i < indices.size(); i += batch_size) {
    out.emplace_back(indices.begin() + i,
                     indices.begin() + std::min(indices.size(), i + batch_size));
  }
  return out;
}

std::vector<std::vector<std::vector<int64_t>>> EveryRankTrainBatches(int64_t n, int world,
                                                                     bool streamed, bool shuffle,
                                                                     uint64_t seed, int64_t epoch,
                                                                     int batch_size) {
  std::vector<std::vector<std::vector<int64_t>>> out;
  out.reserve(static_cast<size_t>(std::max(world, 0)));
  for (int r = 0; r < world; ++r) {
    out.push_back(Batches(TrainIndices(n, world, r, streamed, shuffle, seed, epoch), batch_size));
  }
  return out;
}

}  // namespace dtrain
