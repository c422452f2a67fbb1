// How a sharded dataset's raw sample (its fields' bytes, tar_shard_reader.h) becomes the
// tensors of one batch row: the spec's data.shards.fields, each found by its extension(s) and
// decoded by its type; image fields go through the split's transforms, seeded by
// (seed, epoch, sample key) so a resumed job sees the same augmentations.
//
// Thread-safety: the returned decoder is called from several threads at once.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "dtrain/v1/job_spec.pb.h"
#include "worker/data/sharded_split.h"

namespace dtrain {

// INVALID_ARGUMENT naming the field ("shards.fields[1].type") for no fields, an unknown type or
// a bad transform.
absl::StatusOr<SampleDecoder> MakeSampleDecoder(
    const google::protobuf::RepeatedPtrField<v1::ShardField>& fields, const v1::DataConfig& data,
    uint64_t seed, bool training);

}  // namespace dtrain
