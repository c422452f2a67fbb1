// Constants of dtrain's chunked tensor streams, shared by both ends of every stream.
#pragma once

#include <cstdint>

namespace dtrain {

// The largest message a gRPC client accepts by default (grpc.max_receive_message_length), in
// every language: each message the services send fits it, header and framing included, so a
// generated client with default settings reads every result.
inline constexpr int64_t kDefaultClientMaxMessageBytes = int64_t{4} << 20;

// Payload bytes per stream message: the default limit less room for a header and the framing.
// Large enough that per-message overhead is small; memory grows in steps. A tensor up to this
// size travels in one message and is moved, never re-assembled.
inline constexpr int64_t kStreamChunkBytes = kDefaultClientMaxMessageBytes - (64 << 10);

// Largest single message either end accepts (a chunk plus its header).
inline constexpr int kMaxMessageBytes = 64 << 20;

// Largest message the coordinator accepts: four chunks. gRPC buffers a whole message before any
// handler checks the caller's token, so this bounds what an unauthenticated call can make it
// hold (with the server's resource quota, kCoordinatorMemoryQuotaBytes, over all of them).
inline constexpr int kCoordinatorMaxReceiveBytes = 16 << 20;
inline constexpr int64_t kCoordinatorMemoryQuotaBytes = int64_t{2} << 30;

// The worker's server accepts kMaxMessageBytes (a step's tensor batches) and, like the
// coordinator's, buffers a message whole before its handler checks the token: the quota bounds
// what unauthenticated calls can make it hold, over all of them.
inline constexpr int64_t kWorkerMemoryQuotaBytes = int64_t{2} << 30;

}  // namespace dtrain
