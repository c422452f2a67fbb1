// Everything the thread that runs a rank's model code must have set, taken as one scope so that
// no entry point can set one part and forget another: the rank's device made current
// (current_device.h) and TorchScript's execution mode for that device (script_execution.h).
// The Job's entry points, dp's replicas and the bench's ceiling loop take it.
//
// Thread-safety: a scope belongs to the thread that made it.
#pragma once

#include <torch/types.h>

#include "absl/status/status.h"
#include "worker/model/current_device.h"
#include "worker/model/script_execution.h"

namespace dtrain {

class ModelThreadScope {
 public:
  explicit ModelThreadScope(torch::Device device) : device_(device), script_(device) {}
  ModelThreadScope(const ModelThreadScope&) = delete;
  ModelThreadScope& operator=(const ModelThreadScope&) = delete;

  // Not OK when the device cannot be made current (see CurrentDeviceScope::status).
  const absl::Status& status() const { return device_.status(); }

 private:
  CurrentDeviceScope device_;
  ScriptExecutionScope script_;
};

}  // namespace dtrain
