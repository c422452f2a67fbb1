// How the shm plane splits a buffer among the ranks that reduce it: parts that cover it once, in
// order, whose inner boundaries fall on 64-byte lines of the mapping, each within a line of the
// even split.
#include "worker/collectives/reduction_partition.h"

#include <cstdint>

#include <gtest/gtest.h>

namespace dtrain {
namespace {

TEST(ReductionPartition, PartsCoverTheBufferOnce_InnerBoundariesOnLines) {
  for (const int64_t element : {4, 8}) {
    for (const int64_t count :
         {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{15}, int64_t{16}, int64_t{17}, int64_t{100},
          int64_t{101'765}, int64_t{203'530}, int64_t{3'000'001}, (int64_t{1} << 40) + 7}) {
      for (const int parts : {1, 2, 3, 5, 8, 16, 63, 64}) {
        for (const int64_t first_byte : {int64_t{0}, element, 5 * element, 4096 + 3 * element}) {
          SCOPED_TRACE(testing::Message() << "element " << element << ", count " << count
                                          << ", parts " << parts << ", first_byte " << first_byte);
          EXPECT_EQ(ReductionPartStart(count, 0, parts, first_byte, element), 0);
          EXPECT_EQ(ReductionPartStart(count, parts, parts, first_byte, element), count);
          for (int k = 1; k < parts; ++k) {
            const int64_t start = ReductionPartStart(count, k, parts, first_byte, element);
            const int64_t even = count * k / parts;
            EXPECT_LE(ReductionPartStart(count, k - 1, parts, first_byte, element), start);
            EXPECT_GE(start, even);
            EXPECT_LT(start - even, 64 / element);
            if (start < count) {
              EXPECT_EQ((first_byte + start * element) % 64, 0) << "part " << k;
            }
          }
        }
      }
    }
  }
}

// The case that showed the cost: rank 1's half of the MLP's 2-rank gradient started 20 bytes into
// a line; now it starts 11 floats later, on the next one.
static_assert(203'530 / 2 * 4 % 64 == 20);
TEST(ReductionPartition, MlpGradientsSecondHalf_StartsOnTheNextLine) {
  EXPECT_EQ(ReductionPartStart(203'530, 1, 2, 0, 4), 101'776);
  // Already on a line: the even split stands.
  EXPECT_EQ(ReductionPartStart(204'800, 1, 2, 0, 4), 102'400);
  // A bucket 5 floats into its buffer: the boundary is placed by the mapping's lines.
  EXPECT_EQ((20 + ReductionPartStart(1'000, 1, 2, 20, 4) * 4) % 64, 0);
}

// A rank's [begin, end): each part ends where the next begins, from 0 to the end.
TEST(ReductionPartition, PartsOfThreeRanks_TileTheBuffer) {
  int64_t next = 0;
  for (int k = 0; k < 3; ++k) {
    const ReductionPart part = ReductionPartOf(100'003, k, 3, 20, 4);
    EXPECT_EQ(part.begin, next) << "part " << k;
    EXPECT_LE(part.begin, part.end) << "part " << k;
    next = part.end;
  }
  EXPECT_EQ(next, 100'003);
}

}  // namespace
}  // namespace dtrain
