// One field of a WebDataset sample (the bytes of one tar member, worker/data/tar_shard_reader.h)
// decoded into a tensor, by the type the job spec names or the one its extension implies.
// Every input is untrusted: sizes are checked before anything is allocated from them, parsers
// accept only their format's grammar, and nothing in a field is executed (a .pt is unpickled by
// libtorch's restricted unpickler, which builds tensors and containers, never Python objects).
// Images are not decoded here: the image pipeline owns them.
//
// Thread-safety: stateless functions, callable from any number of decode threads at once.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dtrain {

enum class FieldType {
  kInt,    // ASCII decimal integer -> 0-d int64
  kFloat,  // ASCII decimal number -> 0-d float32
  kNpy,    // numpy.save -> the array's dtype and shape
  kJson,   // a number or rectangular nested lists -> float32 (all booleans -> bool)
  kTorch,  // torch.save of one tensor -> that tensor
  kText,   // UTF-8 text -> 1-d uint8 of its bytes
  kBytes,  // anything -> 1-d uint8 of its bytes
  kImage,  // JPEG/PNG/WebP/PPM/PGM: decoded by the image pipeline, refused by DecodeField
};

// A field larger than this is refused before it is copied (the tar reader's default member
// limit, worker/data/tar_shard_reader.h).
inline constexpr int64_t kMaxFieldBytes = int64_t{64} << 20;

// The type a spec names: "int", "float", "npy", "json", "torch", "text", "bytes" or "image"
// (kImage: the caller hands those fields to the image pipeline). INVALID_ARGUMENT listing them
// for any other name.
absl::StatusOr<FieldType> FieldTypeFromName(absl::string_view name);

// The name FieldTypeFromName takes, for messages.
const char* FieldTypeName(FieldType type);

// The type WebDataset gives a field's extension (lowercase, as the tar reader reports it; for a
// multi-part extension such as "seg.png" the last part counts): cls, cls2, index, idx, id -> int;
// npy -> npy; json -> json; pt, pth -> torch; txt, text -> text; jpg, jpeg, png, webp, ppm,
// pgm -> image; anything else -> bytes.
FieldType DefaultFieldType(absl::string_view extension);

// `bytes` decoded as `type`. The tensor owns its memory (nothing points into `bytes`), is
// contiguous and on the CPU. INVALID_ARGUMENT "<type> field: <reason>" for bytes that are not a
// valid field of that type or exceed a limit (kMaxFieldBytes; the JSON, .npy and integer bounds
// in worker/data/text_fields.h and worker/data/npy_array.h), and for kImage. The caller adds the
// shard, sample key and rank.
absl::StatusOr<at::Tensor> DecodeField(absl::string_view bytes, FieldType type);

// An int or float field written straight into `out` (a 0-dim int64 or float32 tensor: a batch
// row), with no tensor of its own. Errors as DecodeField's; INVALID_ARGUMENT for other types
// or another `out`.
absl::Status DecodeScalarFieldInto(absl::string_view bytes, FieldType type, const at::Tensor& out);

}  // namespace dtrain
