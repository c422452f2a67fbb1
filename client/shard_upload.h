// The client's own shards travel with the job: a data.shards split that names local files (a
// pattern, a directory or a list file) has each shard uploaded to the coordinator's
// content-addressed store (once: a shard the store has is not sent again) and counted, and is
// replaced by an uploaded list file whose lines name each shard by content with its digest and
// sample count. A worker fetches a shard when its rank reads it, never the whole dataset.
// Entries of a list that are URLs or worker paths are kept as they are.
//
// Thread-safety: one call at a time per client.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "client/artifacts_client.h"

namespace dtrain {

struct ShardUpload {
  std::string reference;  // "artifact:sha256:<hex>" of the list
  int shards = 0;
  int sent = 0;       // shards sent now (the others were stored already)
  int64_t bytes = 0;  // of the local shards
  int64_t samples = 0;
};

// `value` is a local pattern, directory or list file; `field` ("data.shards.train") starts
// every message. INVALID_ARGUMENT / NOT_FOUND naming the shard that is missing or malformed.
absl::StatusOr<ShardUpload> UploadShards(ArtifactsClient& client, const std::string& value,
                                         const std::string& field);

}  // namespace dtrain
