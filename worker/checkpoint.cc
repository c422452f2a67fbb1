#include "worker/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/serialize.h>
#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "worker/torch_status.h"

namespace dtrain {
namespace {

constexpr int64_t kVersion = 1;

int64_t ReadInt(torch::serialize::InputArchive& archive, const std::string& key) {
  torch::Tensor t;
  archive.read(key, t);
  return t.item<int64_t>();
}

}  // namespace

absl::Status PrepareCheckpointDirectory(const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create the checkpoint directory '", dir, "': ", error.message()));
  }
  if (!std::filesystem::is_directory(dir, error)) {
    return absl::FailedPreconditionError(
        absl::StrCat("the checkpoint directory '", dir, "' is not a directory"));
  }
  const std::string probe = absl::StrCat(dir, "/.dtrain-write-check-", getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
  if (fd < 0) {
    return absl::FailedPreconditionError(absl::StrCat("cannot write in the checkpoint directory '",
                                                      dir, "': ", std::strerror(errno)));
  }
  ::close(fd);
  std::remove(probe.c_str());
  return absl::OkStatus();
}

absl::Status SaveCheckpoint(const std::string& path, const LightningModule& model,
                            torch::optim::Optimizer* optimizer, const LossScaler* scaler,
                            const TrainingProgress& progress) {
  const std::string temporary = absl::StrCat(path, ".tmp-", getpid());
  absl::Status status =
      GuardTorch(absl::StrCat("cannot write checkpoint '", path, "'"), [&]() -> absl::Status {
        torch::serialize::OutputArchive archive;
        archive.write("dtrain_checkpoint_version", torch::tensor(kVersion));
        torch::jit::Module& module = const_cast<LightningModule&>(model).module();
        for (const auto& p : module.named_parameters()) {
          archive.write("model/" + p.name, p.value.detach(), /*is_buffer=*/false);
        }
        for (const auto& b : module.named_buffers()) {
          archive.write("model/" + b.name, b.value, /*is_buffer=*/true);
        }
        if (optimizer != nullptr) {
          torch::serialize::OutputArchive optimizer_archive;
          optimizer->save(optimizer_archive);
          archive.write("optimizer", optimizer_archive);
        }
        archive.write("global_step", torch::tensor(progress.global_step));
        archive.write("epoch", torch::tensor(progress.epoch));
        if (scaler != nullptr) {
          archive.write("loss_scale", torch::tensor(scaler->scale(), torch::kFloat64));
          archive.write("scale_growth", torch::tensor(scaler->growth_tracker()));
        }
        at::Generator generator = at::detail::getDefaultCPUGenerator();
        {
          std::lock_guard<std::mutex> lock(generator.mutex());
          archive.write("rng_cpu", generator.get_state());
        }
        archive.save_to(temporary);
        return absl::OkStatus();
      });
  if (!status.ok()) {
    std::remove(temporary.c_str());
    return status;
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    std::remove(temporary.c_str());
    return absl::InvalidArgumentError(
        absl::StrCat("cannot move checkpoint into place at '", path, "'"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadCheckpointFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in.good()) {
    return absl::NotFoundError(
        absl::StrCat("checkpoint '", path, "' does not exist or cannot be read"));
  }
  std::ostringstream bytes;
  bytes << in.rdbuf();
  if (in.bad())
    return absl::InvalidArgumentError(absl::StrCat("cannot read checkpoint '", path, "'"));
  return bytes.str();
}

absl::StatusOr<TrainingProgress> LoadCheckpoint(const std::string& path, LightningModule& model,
                                                torch::optim::Optimizer* optimizer,
                                                LossScaler* scaler) {
  absl::StatusOr<std::string> bytes = ReadCheckpointFile(path);
  if (!bytes.ok()) return bytes.status();
  return RestoreCheckpoint(*bytes, path, model, optimizer, scaler);
}

absl::StatusOr<TrainingProgress> RestoreCheckpoint(const std::string& bytes,
                                                   const std::string& path, LightningModule& model,
                                                   torch::optim::Optimizer* optimizer,
                                                   LossScaler* scaler) {
  TrainingProgress progress;
  absl::Status status =
      GuardTorch(absl::StrCat("cannot load checkpoint '", path, "'"), [&]() -> absl::Status {
        torch::serialize::InputArchive archive;
        archive.load_from(bytes.data(), bytes.size());
        torch::Tensor version;
        if (!archive.try_read("dtrain_checkpoint_version", version)) {
          return absl::InvalidArgumentError(
              absl::StrCat("'", path, "' is not a dtrain checkpoint (no version key)"));
        }
        if (version.item<int64_t>() != kVersion) {
          return absl::InvalidArgumentError(absl::StrCat("checkpoint '", path, "' has version ",
                                                         version.item<int64_t>(),
                                                         "; this build reads ", kVersion));
        }
        torch::NoGradGuard no_grad;
        torch::jit::Module& module = model.module();
        auto restore = [&](const std::string& name, torch::Tensor target,
                           bool buffer) -> absl::Status {
          torch::Tensor saved;
          if (!archive.try_read("model/" + name, saved, buffer)) {
            return absl::InvalidArgumentError(
                absl::StrCat("checkpoint '", path, "' has no ", buffer ? "buffer" : "parameter",
                             " '", name, "' of model '", model.origin(), "'"));
          }
          if (saved.sizes() != target.sizes()) {
            return absl::InvalidArgumentError(absl::StrCat(
                "checkpoint '", path, "' holds '", name, "' with shape ", c10::str(saved.sizes()),
                " but model '", model.origin(), "' has ", c10::str(target.sizes())));
          }
          target.copy_(saved);
          return absl::OkStatus();
        };
        for (const auto& p : module.named_parameters()) {
          if (absl::Status s = restore(p.name, p.value, false); !s.ok()) return s;
        }
        for (const auto& b : module.named_buffers()) {
          if (absl::Status s = restore(b.name, b.value, true); !s.ok()) return s;
        }
        if (optimizer != nullptr) {
          torch::serialize::InputArchive optimizer_archive;
          if (archive.try_read("optimizer", optimizer_archive)) optimizer->load(optimizer_archive);
        }
        progress.global_step = ReadInt(archive, "global_step");
        progress.epoch = ReadInt(archive, "epoch");
        torch::Tensor scale;
        if (scaler != nullptr && archive.try_read("loss_scale", scale)) {
          scaler->Restore(scale.item<double>(), ReadInt(archive, "scale_growth"));
        }
        torch::Tensor rng;
        if (archive.try_read("rng_cpu", rng)) {
          at::Generator generator = at::detail::getDefaultCPUGenerator();
          std::lock_guard<std::mutex> lock(generator.mutex());
          generator.set_state(rng);
        }
        return absl::OkStatus();
      });
  if (!status.ok()) return status;
  return progress;
}

}  // namespace dtrain
