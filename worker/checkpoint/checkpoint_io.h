// CheckpointIO (Lightning's plugin of that name): how a checkpoint reaches storage and comes
// back. The Accelerator builds the checkpoint (Lightning's dict, torch.save's format); the job's
// CheckpointIO, named by checkpoint.checkpoint_io and registered in the PluginRegistry, writes
// it with the job's checkpoint.storage_options and reads it back. dtrain's own, "torch", writes
// the file atomically (a temporary file renamed into place) and ignores storage_options.
//
// Thread-safety: one thread at a time (a job's steps are sequential).
#pragma once

#include <map>
#include <string>

#include <ATen/core/ivalue.h>

#include "absl/status/statusor.h"

namespace dtrain {

using StorageOptions = std::map<std::string, std::string>;

class CheckpointIO {
 public:
  virtual ~CheckpointIO() = default;
  virtual std::string name() const = 0;
  // Writes `checkpoint` (a dict in Lightning's layout) to `path`.
  virtual absl::Status Save(const c10::IValue& checkpoint, const std::string& path,
                            const StorageOptions& storage_options) = 0;
  // The bytes Save wrote to `path` (torch.save's format). NOT_FOUND when there is none.
  virtual absl::StatusOr<std::string> Load(const std::string& path) = 0;
};

// "torch": torch.save's format, written to a temporary file and renamed into place.
class TorchCheckpointIO : public CheckpointIO {
 public:
  std::string name() const override { return "torch"; }
  absl::Status Save(const c10::IValue& checkpoint, const std::string& path,
                    const StorageOptions& storage_options) override;
  absl::StatusOr<std::string> Load(const std::string& path) override;
};

}  // namespace dtrain
