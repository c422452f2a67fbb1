// Which samples each rank sees, as torch's DistributedSampler decides it: the split's indices,
// shuffled by seed + epoch when training, padded by repeating the first ones so that every rank
// gets exactly ceil(n / world) samples (hence the same number of batches: no rank waits in a
// collective for a batch another rank never has), and dealt round-robin. Evaluation shards are
// not padded (their steps have no collectives), so every sample counts exactly once.
#pragma once

#include <cstdint>
#include <vector>

namespace dtrain {

// The name of the deal below (LocalWork.sampled's `deal`, SetupResponse.sampler_deal). Workers
// deal their own shards from a call's sampler settings, so every build must deal alike: the
// shuffle is written out (Fisher-Yates over std::mt19937_64, which the standard defines bit for
// bit, each draw bounded by multiply-and-reject), not std::shuffle, whose steps each C++ library
// chooses.
// A change to what TrainShard returns is a new name, so that a coordinator never mixes two deals.
inline constexpr char kSamplerDeal[] = "fisher-yates-mt19937_64/1";

// Rank `rank`'s training indices for `epoch`.
std::vector<int64_t> TrainShard(int64_t n, int world, int rank, bool shuffle, uint64_t seed,
                                int64_t epoch);

// Rank `rank`'s training indices (or positions, for a streamed split) for `epoch`: what the
// coordinator lists and what a worker expands LocalWork.sampled to, from this one function.
std::vector<int64_t> TrainIndices(int64_t n, int world, int rank, bool streamed, bool shuffle,
                                  uint64_t seed, int64_t epoch);

// Rank `rank`'s evaluation indices: i = rank, rank + world, ... < n.
std::vector<int64_t> EvalShard(int64_t n, int world, int rank);

// A streamed split's (data.shards) positions in rank `rank`'s epoch, as the workers plan it
// (worker/data/epoch_plan.h): training, floor(n / world) for every rank, so all ranks take the
// same steps; evaluation, ceil((n - rank) / world), so every sample counts once. The workers
// shuffle; positions are in order.
std::vector<int64_t> StreamPositions(int64_t n, int world, int rank, bool training);
// The sample number of an evaluation rank's position 0: the lower ranks' samples come first.
int64_t StreamEvalOffset(int64_t n, int world, int rank);

// Splits indices into batches of `batch_size` (the last one smaller).
std::vector<std::vector<int64_t>> Batches(const std::vector<int64_t>& indices, int batch_size);

// Every rank's training batches for `epoch`, by rank: the lists a coordinator sends to workers
// that do not deal their own (TrainIndices, then Batches).
std::vector<std::vector<std::vector<int64_t>>> EveryRankTrainBatches(int64_t n, int world,
                                                                     bool streamed, bool shuffle,
                                                                     uint64_t seed, int64_t epoch,
                                                                     int batch_size);

}  // namespace dtrain
