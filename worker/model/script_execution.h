// How TorchScript runs a rank's model code on the calling thread. By default libtorch's graph
// executor profiles a method's first runs and then rewrites its graph (differentiable subgraphs
// with symbolic gradients, shapes specialized, fusion groups). On the CPU, where libtorch 1.13
// fuses nothing by default, the rewritten plan only costs time: the zoo's CNN stepped 1.07-1.26x
// faster (median 1.13, 6 alternated rounds, docs/BENCHMARKS.md) with the executor's optimization
// off, which runs the graph's ops one by one with autograd recording them, as eager PyTorch does.
// The switch (torch::jit::setGraphExecutorOptimize) is per thread, so each thread that runs a
// rank's model code holds a scope. Other devices keep libtorch's default: there the executor's
// fusion may pay, and it was not measured.
//
// Thread-safety: a scope belongs to the thread that made it.
#pragma once

#include <torch/types.h>

namespace dtrain {

// For the scope's life, TorchScript on this thread runs unoptimized when `device` is the CPU;
// then the thread's previous setting returns.
class ScriptExecutionScope {
 public:
  explicit ScriptExecutionScope(torch::Device device);
  ~ScriptExecutionScope();
  ScriptExecutionScope(const ScriptExecutionScope&) = delete;
  ScriptExecutionScope& operator=(const ScriptExecutionScope&) = delete;

 private:
  bool previous_;
};

}  // namespace dtrain
