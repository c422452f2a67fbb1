// How many batches a training step RPC carries: fixed by the spec, or sized from the time calls
// take (about 0.25 s each, growing at most 4x per call, 1 to 1024 batches).
#include "coordinator/jobs/step_call_sizer.h"

#include <gtest/gtest.h>

namespace dtrain {
namespace step_call_sizer_test {

TEST(StepCallSizer, AFixedSizeIsKeptWhateverCallsTake) {
  StepCallSizer sizer(8);
  EXPECT_EQ(sizer.Next(), 8);
  sizer.Observe(8, absl::Microseconds(80));
  EXPECT_EQ(sizer.Next(), 8);
  sizer.Observe(8, absl::Seconds(30));
  EXPECT_EQ(sizer.Next(), 8);
}

TEST(StepCallSizer, FastStepsGrowFourfoldPerCallUpToTheTargetThenHold) {
  StepCallSizer sizer(0);
  EXPECT_EQ(sizer.Next(), 16);
  // 1 ms a batch: the target is 250 batches, reached through 64 and then held.
  sizer.Observe(16, absl::Milliseconds(16));
  EXPECT_EQ(sizer.Next(), 64);
  sizer.Observe(64, absl::Milliseconds(64));
  EXPECT_EQ(sizer.Next(), 250);
  sizer.Observe(250, absl::Milliseconds(250));
  EXPECT_EQ(sizer.Next(), 250);
  // Steps twice as fast: twice as many, capped at 1024 for very fast ones.
  sizer.Observe(250, absl::Milliseconds(125));
  EXPECT_EQ(sizer.Next(), 500);
  sizer.Observe(500, absl::Microseconds(500));
  EXPECT_EQ(sizer.Next(), 1024);
}

TEST(StepCallSizer, SlowStepsShrinkAtOnceDownToOneBatch) {
  StepCallSizer sizer(0);
  sizer.Observe(16, absl::Milliseconds(800));  // 50 ms a batch: 5 make 0.25 s
  EXPECT_EQ(sizer.Next(), 5);
  sizer.Observe(5, absl::Seconds(10));  // 2 s a batch
  EXPECT_EQ(sizer.Next(), 1);
}

TEST(StepCallSizer, ACallCutShortByABoundaryStillMeasuresPerBatch) {
  StepCallSizer sizer(0);
  sizer.Observe(16, absl::Milliseconds(16));
  ASSERT_EQ(sizer.Next(), 64);
  // Only 3 batches were left before validation: 1 ms each, so growth continues from 64.
  sizer.Observe(3, absl::Milliseconds(3));
  EXPECT_EQ(sizer.Next(), 250);
  // A call that measured nothing (zero time) grows as far as growth allows.
  sizer.Observe(250, absl::ZeroDuration());
  EXPECT_EQ(sizer.Next(), 1000);
  sizer.Observe(0, absl::Seconds(5));  // no batches: nothing learned
  EXPECT_EQ(sizer.Next(), 1000);
}

TEST(StepCallSizer, ACallTakesAShortRestBeforeABoundaryButAFixedSizeNever) {
  StepCallSizer sizer(0);
  sizer.Observe(16, absl::Milliseconds(16));
  sizer.Observe(64, absl::Milliseconds(64));
  ASSERT_EQ(sizer.Next(), 250);
  EXPECT_EQ(sizer.Until(100), 100) << "the boundary comes first";
  EXPECT_EQ(sizer.Until(250), 250);
  // A rest under half a call (124 of 250) is taken along: one call of 374, not 250 and 124.
  EXPECT_EQ(sizer.Until(374), 374);
  EXPECT_EQ(sizer.Until(375), 250) << "a rest of half a call makes its own call";
  EXPECT_EQ(sizer.Until(100000), 250);
  // Never past kMost, however short the rest.
  sizer.Observe(250, absl::Microseconds(250));
  sizer.Observe(1000, absl::Milliseconds(1));
  ASSERT_EQ(sizer.Next(), StepCallSizer::kMost);
  EXPECT_EQ(sizer.Until(StepCallSizer::kMost + 10), StepCallSizer::kMost);

  StepCallSizer fixed(8);
  EXPECT_EQ(fixed.Until(11), 8);
  EXPECT_EQ(fixed.Until(5), 5);
}

TEST(StepCallSizer, SummaryCountsTheCallsAndPredictNeverGrows) {
  StepCallSizer fixed(8);
  EXPECT_EQ(fixed.PredictBatches(), 8);
  for (int i = 0; i < 3; ++i) fixed.Observe(8, absl::Milliseconds(8));
  EXPECT_EQ(fixed.Summary(), "3 training calls (batches per call: 8)");

  StepCallSizer sized(0);
  sized.Observe(16, absl::Milliseconds(16));
  sized.Observe(64, absl::Milliseconds(64));
  sized.Observe(20, absl::Milliseconds(20));  // cut short by the epoch's end
  EXPECT_EQ(sized.Summary(), "3 training calls (batches per call: auto, up to 64)");
  EXPECT_EQ(sized.PredictBatches(), 16) << "predict's answers carry outputs: never grown";
  sized.Observe(64, absl::Milliseconds(64), /*pipelined=*/true);
  EXPECT_EQ(sized.Summary(), "4 training calls (batches per call: auto, up to 64), 1 pipelined");
}

}  // namespace step_call_sizer_test
}  // namespace dtrain
