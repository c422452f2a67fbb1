// An example dtrain plugin library (docs/extending.md): the strategy "recording_ddp", which is
// ddp plus a record of what it does, and the checkpoint IO "checksum", which writes torch.save's
// file as "torch" does and a SHA-256 beside it, and refuses to load a file that does not match.
//
//   dtrain-worker --plugin=build/examples/plugins/libdtrain_example_plugins.so
//   trainer: {strategy: recording_ddp}
//   checkpoint: {checkpoint_io: checksum, storage_options: {fsync: "true"}}
//
// recording_ddp appends one line per hook to $RECORDING_DDP_DIR/rank-<global rank>.log (when
// the variable is set) and logs it; checksum appends each digest it writes to
// $RECORDING_DDP_DIR/checksum.log, as the sidecars go with the worker's scratch at teardown.
// The library's entry point, at the end, also registers the accelerator "gradient_watch"
// (gradient_watch.cc).
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/sha256.h"
#include "examples/plugins/gradient_watch.h"
#include "worker/checkpoint/checkpoint_io.h"
#include "worker/plugins/plugin_registry.h"
#include "worker/strategies/ddp_strategy.h"

namespace example {

class RecordingDdp : public dtrain::DdpStrategy {
 public:
  using DdpStrategy::DdpStrategy;

  absl::Status PreDispatch() override { return Record("pre_dispatch"); }
  absl::Status Dispatch() override { return Record("dispatch"); }
  absl::Status PostDispatch() override { return Record("post_dispatch"); }
  absl::Status OnTrainStart() override { return Record("on_train_start"); }
  absl::Status OnTrainEnd() override { return Record("on_train_end"); }
  absl::Status OnValidationStart() override { return Record("on_validation_start"); }
  absl::Status OnValidationEnd() override { return Record("on_validation_end"); }
  absl::Status OnTestStart() override { return Record("on_test_start"); }
  absl::Status OnTestEnd() override { return Record("on_test_end"); }
  absl::Status OnPredictStart() override { return Record("on_predict_start"); }
  absl::Status OnPredictEnd() override { return Record("on_predict_end"); }
  absl::Status OnTrainBatchStart(int64_t batch_idx) override {
    return Record(absl::StrCat("on_train_batch_start ", batch_idx));
  }
  absl::Status PostOptimizerStep() override { return Record("post_optimizer_step"); }
  absl::Status Teardown() override {
    if (absl::Status s = Record("teardown"); !s.ok()) return s;
    return DdpStrategy::Teardown();
  }

 private:
  absl::Status Record(const std::string& what) {
    dtrain::LogDebug(absl::StrCat("recording_ddp: ", what),
                     {{"rank", static_cast<int64_t>(global_rank())}});
    const char* dir = std::getenv("RECORDING_DDP_DIR");
    if (dir == nullptr) return absl::OkStatus();
    std::ofstream out(absl::StrCat(dir, "/rank-", global_rank(), ".log"), std::ios::app);
    out << what << "\n";
    if (!out.good())
      return absl::InternalError(absl::StrCat("recording_ddp: cannot write to ", dir));
    return absl::OkStatus();
  }
};

class ChecksumCheckpointIO : public dtrain::TorchCheckpointIO {
 public:
  std::string name() const override { return "checksum"; }

  absl::Status Save(const c10::IValue& checkpoint, const std::string& path,
                    const dtrain::StorageOptions& storage_options) override {
    if (absl::Status s = TorchCheckpointIO::Save(checkpoint, path, storage_options); !s.ok()) {
      return s;
    }
    absl::StatusOr<std::string> bytes = TorchCheckpointIO::Load(path);
    if (!bytes.ok()) return bytes.status();
    auto option = storage_options.find("fsync");
    const bool sync = option == storage_options.end() || option->second != "false";
    const std::string digest = Digest(*bytes);
    if (absl::Status s = WriteSidecar(path + ".sha256", digest + "\n", sync); !s.ok()) return s;
    if (const char* dir = std::getenv("RECORDING_DDP_DIR"); dir != nullptr) {
      std::ofstream out(absl::StrCat(dir, "/checksum.log"), std::ios::app);
      out << digest << "\n";
      if (!out.good()) return absl::InternalError(absl::StrCat("checksum: cannot write to ", dir));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> Load(const std::string& path) override {
    absl::StatusOr<std::string> bytes = TorchCheckpointIO::Load(path);
    if (!bytes.ok()) return bytes;
    std::ifstream in(path + ".sha256");
    std::string expected;
    if (!(in >> expected)) return bytes;  // written by another checkpoint IO: nothing to check
    const std::string actual = Digest(*bytes);
    if (actual != expected) {
      return absl::DataLossError(absl::StrCat("checkpoint '", path, "' has SHA-256 ", actual,
                                              " but ", path, ".sha256 says ", expected));
    }
    return bytes;
  }

 private:
  static std::string Digest(const std::string& bytes) {
    dtrain::Sha256 hash;
    hash.Update(bytes);
    return hash.Finish();  // "sha256:<hex>"
  }
  static absl::Status WriteSidecar(const std::string& path, const std::string& text, bool sync) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return absl::InternalError(absl::StrCat("checksum: cannot create ", path));
    const bool written = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
    const bool synced = !sync || ::fsync(fd) == 0;
    ::close(fd);
    if (!written || !synced)
      return absl::InternalError(absl::StrCat("checksum: cannot write ", path));
    return absl::OkStatus();
  }
};

}  // namespace example

DTRAIN_PLUGIN(registry) {
  (void)registry.AddStrategy(
      "recording_ddp", {.distributed = true},
      [](const dtrain::StrategyOptions& options, std::unique_ptr<dtrain::CollectiveBackend> backend)
          -> absl::StatusOr<std::unique_ptr<dtrain::Strategy>> {
        return std::unique_ptr<dtrain::Strategy>(
            new example::RecordingDdp(options, std::move(backend)));
      },
      "ddp, recording every hook it is called at (examples/plugins)");
  (void)registry.AddCheckpointIO(
      "checksum",
      []() -> absl::StatusOr<std::unique_ptr<dtrain::CheckpointIO>> {
        return std::make_unique<example::ChecksumCheckpointIO>();
      },
      "torch.save's file plus a SHA-256 beside it, checked on load; storage_options fsync");
  example::RegisterGradientWatch(registry);
}
