#include "worker/model/script_execution.h"

#include <torch/csrc/jit/python/update_graph_executor_opt.h>

namespace dtrain {

ScriptExecutionScope::ScriptExecutionScope(torch::Device device)
    : previous_(torch::jit::getGraphExecutorOptimize()) {
  if (device.is_cpu()) torch::jit::setGraphExecutorOptimize(false);
}

ScriptExecutionScope::~ScriptExecutionScope() { torch::jit::setGraphExecutorOptimize(previous_); }

}  // namespace dtrain
