// Lightning's self.log names and epoch aggregates, as the coordinator computes them from every
// rank's batches (coordinator/jobs/logged_metrics.h).
#include "coordinator/jobs/logged_metrics.h"

#include <gtest/gtest.h>

namespace dtrain {
namespace logged_metrics_test {

LoggedValue Value(double local, double weight, const std::string& reduce_fx = "mean",
                  bool on_step = false, bool on_epoch = true) {
  return LoggedValue{.value = local * 100,  // a synced step value, never an epoch's input
                     .local_value = local,
                     .on_step = on_step,
                     .on_epoch = on_epoch,
                     .reduce_fx = reduce_fx,
                     .weight = weight};
}

TEST(LoggedMetricNames, SuffixesOnlyWhenLoggedBothWays) {
  EXPECT_EQ(StepKey("loss", Value(1, 1, "mean", true, false)), "loss");
  EXPECT_EQ(EpochKey("loss", Value(1, 1, "mean", false, true)), "loss");
  EXPECT_EQ(StepKey("acc", Value(1, 1, "mean", true, true)), "acc_step");
  EXPECT_EQ(EpochKey("acc", Value(1, 1, "mean", true, true)), "acc_epoch");
}

TEST(LoggedAggregates, MeanWeighsByBatchSize_OtherReductions_LocalValues) {
  LoggedAggregates epoch;
  // Two ranks, the second with a short last batch: the mean is per sample.
  epoch.Add("val_loss", Value(1.0, 32));
  epoch.Add("val_loss", Value(2.0, 32));
  epoch.Add("val_loss", Value(4.0, 8));
  epoch.Add("seen", Value(3, 32, "max"));
  epoch.Add("seen", Value(5, 32, "max"));
  epoch.Add("low", Value(3, 32, "min"));
  epoch.Add("low", Value(-2, 32, "min"));
  epoch.Add("samples", Value(32, 32, "sum"));
  epoch.Add("samples", Value(8, 8, "sum"));
  epoch.Add("acc", Value(0.5, 10, "mean", true, true));
  epoch.Add("per_step_only", Value(7, 1, "mean", true, false));
  const std::map<std::string, double> got = epoch.Take();
  EXPECT_DOUBLE_EQ(got.at("val_loss"), (32.0 + 64.0 + 32.0) / 72.0);
  EXPECT_EQ(got.at("seen"), 5);
  EXPECT_EQ(got.at("low"), -2);
  EXPECT_EQ(got.at("samples"), 40);
  EXPECT_EQ(got.at("acc_epoch"), 0.5);
  EXPECT_EQ(got.count("per_step_only"), 0u);
  EXPECT_EQ(got.count("acc"), 0u);
  EXPECT_TRUE(epoch.empty()) << "Take starts the next epoch empty";
  EXPECT_TRUE(epoch.Take().empty());
}

TEST(LoggedAggregates, ZeroWeights_FallBackToThePlainMean) {
  LoggedAggregates epoch;
  epoch.Add("x", Value(1, 0));
  epoch.Add("x", Value(3, 0));
  EXPECT_EQ(epoch.Take().at("x"), 2);
}

}  // namespace logged_metrics_test
}  // namespace dtrain
