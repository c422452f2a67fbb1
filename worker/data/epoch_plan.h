// Which samples of a sharded split one rank reads in one epoch, and in what order: the plan
// that makes streaming exact. Plain C++ and pure, so the same inputs give the same samples on
// every worker, after a restart and in a test without files.
//
// The split's shards, in listed order or (training with shuffle) in an order drawn from
// (seed, epoch), form one virtual sequence of N samples. A training rank takes the contiguous
// chunk [rank * L, (rank + 1) * L) with L = floor(N / world): every rank has the same number of
// samples (no rank waits in a collective for a batch another never has) and the N mod world
// samples at the end, different ones each epoch, are left out, like DistributedSampler with
// drop_last. An evaluation rank takes ceil((N - rank) / world) samples, contiguous too, so every
// sample counts exactly once. A chunk is whole shards except at its two ends, so each rank reads
// its own shards (about N / world samples' worth), not the dataset.
//
// Training then passes the chunk through a shuffle buffer (WebDataset's shuffle(n), torchdata's
// Shuffler): a buffer of `size` samples, each incoming sample swapping with a random one that
// goes out, seeded by (seed, epoch, rank).
//
// Thread-safety: functions are pure; a ShuffleBuffer belongs to one thread.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <utility>
#include <vector>

namespace dtrain {

// Samples [skip, skip + take) of shard `shard` (an index into the split's shard list).
struct ShardSegment {
  int64_t shard = 0;
  int64_t skip = 0;
  int64_t take = 0;
};

struct EpochPlanInput {
  std::vector<int64_t> shard_samples;  // per shard, in listed order
  int world = 1;
  int rank = 0;
  bool training = true;
  bool shuffle = true;  // training only: the shard order changes per epoch
  uint64_t seed = 0;
  int64_t epoch = 0;
};

// Samples one rank reads per epoch: floor(N / world) for training, ceil((N - rank) / world) for
// evaluation.
int64_t RankEpochSamples(int64_t total, int world, int rank, bool training);

// The shard order of an epoch: listed order, or a permutation drawn from (seed, epoch).
std::vector<int64_t> EpochShardOrder(int64_t shards, bool shuffle, uint64_t seed, int64_t epoch);

// The rank's segments, in reading order; their takes sum to RankEpochSamples.
std::vector<ShardSegment> PlanRankEpoch(const EpochPlanInput& in);

// A 64-bit seed mixed from the parts (splitmix64 over each), so that nearby seeds, epochs and
// ranks give unrelated streams.
uint64_t MixSeed(std::initializer_list<uint64_t> parts);

// A uniform integer in [0, n) from `rng`, by rejection, so the result does not depend on the
// standard library (std::uniform_int_distribution's algorithm is unspecified).
uint64_t UniformBelow(std::mt19937_64& rng, uint64_t n);

// WebDataset's shuffle buffer over items of type T. Push returns the item that leaves (nullopt
// while filling); Drain empties the rest in random order.
template <typename T>
class ShuffleBuffer {
 public:
  ShuffleBuffer(size_t size, uint64_t seed) : size_(size), rng_(seed) {}

  std::optional<T> Push(T item) {
    if (size_ == 0) return item;
    if (items_.size() < size_) {
      items_.push_back(std::move(item));
      return std::nullopt;
    }
    const size_t j = UniformBelow(rng_, items_.size());
    T out = std::move(items_[j]);
    items_[j] = std::move(item);
    return out;
  }
  std::optional<T> Drain() {
    if (items_.empty()) return std::nullopt;
    const size_t j = UniformBelow(rng_, items_.size());
    T out = std::move(items_[j]);
    items_[j] = std::move(items_.back());
    items_.pop_back();
    return out;
  }
  size_t held() const { return items_.size(); }

 private:
  const size_t size_;
  std::mt19937_64 rng_;
  std::vector<T> items_;
};

}  // namespace dtrain
