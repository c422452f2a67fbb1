// A user's own sample transform, written in Python and saved with torch.jit.save
// (data.transforms.script): forward(fields: List[Tensor], seed: int) -> List[Tensor], run on
// the decoding threads after the built-in image transforms. The one file of worker/data that
// includes TorchScript.
//
// Thread-safety: Apply may be called from several threads at once (a loaded module's forward
// only reads its parameters; each call runs without autograd).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"

namespace dtrain {

class ScriptTransform {
 public:
  // INVALID_ARGUMENT naming `path` when it is not a TorchScript module with a forward.
  static absl::StatusOr<std::shared_ptr<const ScriptTransform>> Load(const std::string& path,
                                                                     bool training);
  ~ScriptTransform();

  // The transformed fields. INVALID_ARGUMENT with the module's own error, or when it does not
  // return a list of tensors.
  absl::StatusOr<std::vector<at::Tensor>> Apply(std::vector<at::Tensor> fields,
                                                uint64_t seed) const;

 private:
  struct Module;
  explicit ScriptTransform(std::unique_ptr<Module> module);
  std::unique_ptr<Module> module_;
};

}  // namespace dtrain
