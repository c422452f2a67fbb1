#include "bench/lockstep_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "worker/collectives/rank_order_reduction.h"
#include "worker/collectives/reduction_partition.h"
#include "worker/strategies/elementwise_optimizer.h"

namespace dtrain::bench {

absl::StatusOr<std::unique_ptr<LockstepBarrier>> LockstepBarrier::Open(const std::string& path,
                                                                       int rank, int world,
                                                                       int64_t exchange,
                                                                       int regions) {
  if (world < 1 || world > kMaxWorld || rank < 0 || rank >= world) {
    return absl::InvalidArgumentError("--lockstep needs 0 <= rank < world_size <= 64");
  }
  const int fd = open(path.c_str(), O_RDWR | O_CREAT, 0600);
  if (fd < 0) return absl::InternalError(absl::StrCat("open ", path, ": ", strerror(errno)));
  const size_t region = (sizeof(float) * exchange + 4095) / 4096 * 4096;
  const size_t stride = region * regions;
  const size_t bytes = 4096 + stride * world;
  // Grown, never shrunk: a rank that maps less must not cut the file under another's mapping
  // (the first barrier then reports the ranks' disagreement).
  struct stat now {};
  void* at = fstat(fd, &now) == 0 && (static_cast<size_t>(now.st_size) >= bytes ||
                                      ftruncate(fd, static_cast<off_t>(bytes)) == 0)
                 ? mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                 : MAP_FAILED;
  const int error = errno;
  close(fd);
  if (at == MAP_FAILED) {
    return absl::InternalError(absl::StrCat("map ", path, ": ", strerror(error)));
  }
  // Every page mapped now, before any clock starts, so that a timed step takes none of the
  // file's faults; read, not written, since a peer may already be using its pages.
  for (size_t page = 4096; page < bytes; page += 4096) {
    static_cast<void>(static_cast<volatile const char*>(at)[page]);
  }
  auto barrier = std::unique_ptr<LockstepBarrier>(new LockstepBarrier(
      static_cast<std::atomic<uint64_t>*>(at), rank, world, exchange, region, stride));
  // Only this rank writes its slot: a count there is a previous run's, whose counters would
  // let every wait pass at once and measure a free run instead.
  if (barrier->counts_[rank * 8].load() != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("--lockstep: ", path, " holds a previous run's counters; remove it"));
  }
  // Beside the count, on the rank's own line: what it exchanges, checked at the first barrier.
  barrier->counts_[rank * 8 + 1].store(static_cast<uint64_t>(exchange * regions));
  return barrier;
}

LockstepBarrier::~LockstepBarrier() { munmap(counts_, 4096 + stride_ * world_); }

absl::Status LockstepBarrier::ArriveAndWait() {
  ++arrivals_;
  counts_[rank_ * 8].store(arrivals_, std::memory_order_release);
  const absl::Time deadline = absl::Now() + absl::Minutes(1);
  for (int r = 0; r < world_; ++r) {
    for (int spins = 0; counts_[r * 8].load(std::memory_order_acquire) < arrivals_; ++spins) {
      if (spins % 4096 == 4095 && absl::Now() > deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "--lockstep: rank ", r, " did not reach step ", arrivals_, " within a minute"));
      }
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
    }
    if (arrivals_ == 1 && counts_[r * 8 + 1].load() != counts_[rank_ * 8 + 1].load()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--lockstep: rank ", r, " shares ", counts_[r * 8 + 1].load(),
          " floats a step and this rank ", counts_[rank_ * 8 + 1].load(),
          " (give every rank the same --average_gradients, --split_step and --model)"));
    }
  }
  return absl::OkStatus();
}

// Each of `parameters`' part of `at` (its length in floats: their elements together), as a
// tensor, and the parameter's gradient pointed there. The averaging reads them as flat float
// arrays.
absl::StatusOr<std::vector<torch::Tensor>> PlaceGradients(
    const std::vector<torch::Tensor>& parameters, float* at) {
  std::vector<torch::Tensor> places;
  for (torch::Tensor p : parameters) {
    if (p.scalar_type() != torch::kFloat32 || !p.requires_grad()) {
      return absl::FailedPreconditionError(
          "--average_gradients: every parameter must be float32 and require grad");
    }
    places.push_back(torch::from_blob(at, p.sizes(), torch::kFloat32));
    p.mutable_grad() = places.back();
    at += p.numel();
  }
  return places;
}

std::unique_ptr<GradientLanding> MakeLanding(const std::vector<torch::Tensor>& parameters,
                                             float* at) {
  std::vector<torch::Tensor> places;
  for (const torch::Tensor& p : parameters) {
    places.push_back(torch::from_blob(at, p.sizes(), torch::kFloat32));
    at += p.numel();
  }
  return std::make_unique<GradientLanding>(std::move(places));
}

absl::Status GradientsLanded(GradientLanding& landing, const std::vector<torch::Tensor>& parameters,
                             const std::vector<torch::Tensor>& places) {
  for (size_t i = 0; i < parameters.size(); ++i) {
    torch::Tensor p = parameters[i];
    if (!landing.PlaceGradient(i, p.grad())) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--split_step: parameter #", i, "'s landing place is held by another tensor"));
    }
    p.mutable_grad() = places[i];
  }
  return absl::OkStatus();
}

// Backward leaves new gradients (zero_grad set them to none): copies each into its place in the
// shared file and points the parameter's gradient there again, as a ddp bucket takes them.
void GradientsToPlaces(const std::vector<torch::Tensor>& parameters,
                       const std::vector<torch::Tensor>& places) {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < parameters.size(); ++i) {
    torch::Tensor p = parameters[i];
    if (p.grad().defined() && p.grad().data_ptr() == places[i].data_ptr()) continue;
    if (p.grad().defined()) {
      places[i].copy_(p.grad());
    } else {
      places[i].zero_();
    }
    p.mutable_grad() = places[i];
  }
}

// --split_step: moves each of `parameters` into its part of `at` (their elements together, in
// order), with its values, so that the other ranks can write the new values there.
void PlaceParameters(const std::vector<torch::Tensor>& parameters, float* at) {
  torch::NoGradGuard no_grad;
  for (torch::Tensor p : parameters) {
    torch::Tensor place = torch::from_blob(at, p.sizes(), torch::kFloat32);
    place.copy_(p);
    p.set_(place);
    at += p.numel();
  }
}

// --split_step: an optimizer of `loop`'s kind over elements [begin, end) of the parameters laid
// out at `values` (their gradients at `gradients`), as one tensor: the loop has one param group
// and starts its state fresh, so ddp's split step steps such a range as one tensor too
// (SplitOptimizerStep's runs).
absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> PartOptimizer(const PlainLoop& loop,
                                                                       float* values,
                                                                       float* gradients,
                                                                       int64_t begin, int64_t end) {
  const ElementwiseOptimizer* kind = ElementwiseOptimizer::Of(loop.optimizer());
  if (kind == nullptr || loop.optimizer().param_groups().size() != 1) {
    return absl::FailedPreconditionError("--split_step: the loop's optimizer does not split");
  }
  std::vector<torch::Tensor> slices;
  if (begin < end) {
    slices.push_back(torch::from_blob(values + begin, {end - begin}, torch::kFloat32));
    slices.back().mutable_grad() =
        torch::from_blob(gradients + begin, {end - begin}, torch::kFloat32);
  }
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::move(slices), loop.optimizer().param_groups()[0].options().clone());
  return kind->Make(std::move(groups), loop.optimizer());
}

// The shm plane's in-place all_reduce of a ddp bucket, between its two barriers (lockstep_file.h).
void ReduceOwnPart(const LockstepBarrier& lockstep, int rank, int world, bool from_landing,
                   bool own_only) {
  const int64_t total = lockstep.exchange();
  // The plane's parts (each rank's gradients start on a page of the file).
  const auto [begin, end] = ReductionPartOf(total, rank, world, 0, sizeof(float));
  std::vector<const float*> in(world);
  std::vector<float*> out(world);
  for (int r = 0; r < world; ++r) {
    out[r] = lockstep.Gradients(r) + begin;
    in[r] = from_landing ? lockstep.Landing(r) + begin : out[r];
  }
  if (own_only) {
    ReduceInRankOrder<float>(in.data(), world, &out[rank], 1, end - begin, ReductionKind::kMean);
  } else {
    ReduceInRankOrder<float>(in.data(), world, out.data(), world, end - begin,
                             ReductionKind::kMean);
  }
}

}  // namespace dtrain::bench
