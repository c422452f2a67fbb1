// Test data and an independent, element-by-element reference for every collective, computed
// in the test rather than trusted from the coordinator.
#pragma once

#include <cstdint>
#include <vector>

#include "common/tensor.h"
#include "dtrain/v1/coordinator.pb.h"

namespace dtrain::testing {

inline const std::vector<v1::DType>& AllDTypes() {
  static const std::vector<v1::DType> kAll = {
      v1::DTYPE_FLOAT32, v1::DTYPE_FLOAT64, v1::DTYPE_FLOAT16, v1::DTYPE_BFLOAT16, v1::DTYPE_INT8,
      v1::DTYPE_UINT8,   v1::DTYPE_INT32,   v1::DTYPE_INT64,   v1::DTYPE_BOOL};
  return kAll;
}

inline const std::vector<v1::ReduceOp>& AllReduceOps() {
  static const std::vector<v1::ReduceOp> kAll = {v1::REDUCE_OP_SUM, v1::REDUCE_OP_MEAN,
                                                 v1::REDUCE_OP_MAX, v1::REDUCE_OP_MIN,
                                                 v1::REDUCE_OP_PRODUCT};
  return kAll;
}

// Deterministic per (seed, rank) data of `shape`: floats in [-2, 2], small integers, 0/1 bools.
HostTensor MakeInput(v1::DType dtype, const std::vector<int64_t>& shape, int rank, uint64_t seed);

// The reduction of `inputs` (rank order) as dtrain defines it, computed one element at a time.
HostTensor ReferenceReduce(const std::vector<HostTensor>& inputs, v1::ReduceOp op);

}  // namespace dtrain::testing
