// Which part of a buffer each rank reduces in the shared-memory plane's all_reduce: the buffer
// split into `parts` nearly equal runs whose boundaries fall on 64-byte cache lines.
//
// Why lines: split at count * k / parts, rank 1's half of the MLP's 2-rank gradient (203,530
// floats) started 20 bytes into a line, so every other 32-byte load and store of its AVX2 pass
// straddled two lines, and both ranks' cores wrote the line at the boundary. In a bench of two
// pinned threads (bench/reduction_split_bench.cc) its half took 1.2-1.6x rank 0's time; on line
// boundaries the two were within 18% of each other. Inside jobs the difference is a few us, below
// their noise (docs/BENCHMARKS.md, "The split between the ranks, on cache lines").
#ifndef DTRAIN_WORKER_REDUCTION_PARTITION_H_
#define DTRAIN_WORKER_REDUCTION_PARTITION_H_

#include <algorithm>
#include <cstdint>

namespace dtrain {

inline constexpr int64_t kReductionLineBytes = 64;

// The first element of part `k` (0 <= k <= parts; part `parts` starts at `count`, the end) of
// `count` elements of `element_bytes` each (a divisor of 64), the first of which sits
// `first_byte` bytes (a multiple of `element_bytes`; otherwise no element starts a line) into a
// 64-byte-aligned mapping. Every rank passes the same values and so gets the same parts; together
// they cover the buffer once. Boundaries move up (at most 15 floats), so a part may be empty when
// count is small.
inline int64_t ReductionPartStart(int64_t count, int k, int parts, int64_t first_byte,
                                  int64_t element_bytes) {
  if (k <= 0) return 0;
  if (k >= parts) return count;
  const int64_t even = count * k / parts;
  const int64_t at = first_byte + even * element_bytes;
  const int64_t to_line = (kReductionLineBytes - at % kReductionLineBytes) % kReductionLineBytes;
  return std::min(count, even + to_line / element_bytes);
}

// Part `k` (0 <= k < parts) as [begin, end): what a rank reduces.
struct ReductionPart {
  int64_t begin;
  int64_t end;
};
inline ReductionPart ReductionPartOf(int64_t count, int k, int parts, int64_t first_byte,
                                     int64_t element_bytes) {
  return {ReductionPartStart(count, k, parts, first_byte, element_bytes),
          ReductionPartStart(count, k + 1, parts, first_byte, element_bytes)};
}

}  // namespace dtrain

#endif  // DTRAIN_WORKER_REDUCTION_PARTITION_H_
