// How WebDataset groups a tar shard's members into samples, and a shard's sample count from its
// headers alone: shared by the worker's shard reader and the client, which counts the shards it
// uploads so that every rank can plan its part of an epoch before reading any. Plain C++ with
// libarchive (Debian's libarchive-dev).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/statusor.h"

namespace dtrain {

// Splits a member's path into its sample key and field name, as WebDataset does: the key is the
// path up to the first '.' of its last component, the field the rest, lowercased. nullopt for a
// path with no '.' in its last component, or one starting with '.'.
std::optional<std::pair<std::string, std::string>> SplitMemberName(const std::string& path);

// Samples in a local tar shard (uncompressed or gzip), by walking its headers: members' data is
// skipped, not read. NOT_FOUND for a missing file, DATA_LOSS for a damaged one, naming it.
absl::StatusOr<int64_t> CountTarSamples(const std::string& path);

}  // namespace dtrain
