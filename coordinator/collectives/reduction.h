// Element-wise reductions over raw little-endian buffers, for every wire dtype and ReduceOp.
// The coordinator links no libtorch, so it reduces bytes itself.
//
// Determinism: each element is combined in rank order, ((in[0] op in[1]) op in[2]) ..., so a
// result depends only on the inputs, never on arrival order or thread timing. float16 and
// bfloat16 accumulate in float32 and round once at the end. Integer sum and product wrap
// (two's complement) as torch's do; integer mean accumulates in 64 bits and rounds toward
// zero; mean of bool is refused. Max and min propagate NaN.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "dtrain/v1/coordinator.pb.h"
#include "dtrain/v1/tensor.pb.h"

namespace dtrain {

// INVALID_ARGUMENT when `op` does not apply to `dtype` (mean of bool, unknown values).
absl::Status CheckReducible(v1::DType dtype, v1::ReduceOp op);

// Reduces inputs[0..n) (each `numel` elements of `dtype`) into `out`, which may alias none of
// them. `out` must hold numel elements.
absl::Status ReduceBuffers(v1::DType dtype, v1::ReduceOp op, const std::vector<const char*>& inputs,
                           int64_t numel, char* out);

std::string ReduceOpName(v1::ReduceOp op);

}  // namespace dtrain
