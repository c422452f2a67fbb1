// Constants of dtrain's chunked tensor streams, shared by both ends of every stream.
#pragma once

#include <cstdint>

namespace dtrain {

// Payload bytes per stream message. Large enough that per-message overhead is small, small
// enough that a message never nears gRPC's limits and memory grows in steps.
// A tensor up to this size travels in one message and is moved, never re-assembled.
inline constexpr int64_t kStreamChunkBytes = int64_t{4} << 20;

// Largest single message either end accepts (a chunk plus its header).
inline constexpr int kMaxMessageBytes = 64 << 20;

}  // namespace dtrain
