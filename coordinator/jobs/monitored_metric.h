// What ModelCheckpoint and EarlyStopping monitor, as Lightning's callbacks do: a validation
// metric, or a training epoch value the model logs (self.log with on_epoch in training_step),
// checked at each validation, or at each epoch's end when this fit runs no validation.
#pragma once

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "coordinator/jobs/trainer_callback.h"

namespace dtrain {

// The value of `monitor` among `values` (a validation's metrics and the latest training epoch
// values); FAILED_PRECONDITION naming `section` ("checkpoint", "early_stopping") and what the
// run has when it is not there.
absl::StatusOr<double> MonitoredValue(const std::map<std::string, double>& values,
                                      const std::string& monitor, const std::string& section);

// Validation never runs in this fit: its split is empty, or trainer.limit_val_batches is 0.
bool ValidationOff(TrainerControl& trainer);

}  // namespace dtrain
