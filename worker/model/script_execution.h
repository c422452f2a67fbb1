// How TorchScript runs a rank's model code on the calling thread. By default libtorch's graph
// executor profiles a method's first runs and then rewrites its graph (differentiable subgraphs
// with symbolic gradients, shapes specialized, fusion groups). On the CPU, where libtorch 1.13
// fuses nothing by default, the rewritten plan cost the zoo's CNN time: its loop stepped
// 1.07-1.26x faster (median 1.13, 6 alternated rounds, docs/BENCHMARKS.md) with the executor's
// optimization off, which runs the graph's ops one by one with autograd recording them, as eager
// PyTorch does (a 2-rank job on a 2-core VM did not gain measurably; not understood). The switch
// (torch::jit::setGraphExecutorOptimize) is per thread, and it counts only until a method has
// built its optimized plan, which every later call then uses, scope or not: so a rank's model
// code runs inside a scope from its first call (each of the Job's entry points takes one, as
// part of ModelThreadScope).
// Other devices keep libtorch's default: there the executor's fusion may pay, and it was not
// measured.
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
