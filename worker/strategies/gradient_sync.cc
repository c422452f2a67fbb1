#include "worker/strategies/gradient_sync.h"

#include <c10/core/alignment.h>
#include <torch/csrc/autograd/function.h>
#include <torch/types.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "worker/model/current_device.h"

namespace dtrain {
namespace {

// Flattens `tensors` into one contiguous buffer, runs one collective on it, and writes the
// result back into `tensors`.
template <typename Collective>
absl::Status OverFlat(const std::vector<torch::Tensor>& tensors, Collective collective) {
  if (tensors.empty()) return absl::OkStatus();
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> flat_parts;
  flat_parts.reserve(tensors.size());
  for (const torch::Tensor& t : tensors) flat_parts.push_back(t.reshape({-1}));
  torch::Tensor result = torch::cat(flat_parts);
  DTRAIN_RETURN_IF_ERROR(collective(result));
  int64_t offset = 0;
  for (const torch::Tensor& t : tensors) {
    const int64_t n = t.numel();
    t.copy_(result.slice(0, offset, offset + n).view(t.sizes()));
    offset += n;
  }
  return absl::OkStatus();
}

// Whether `grad` is the `numel` elements at element `offset` of `flat` (the bucket it lives in).
bool LivesIn(const torch::Tensor& grad, const torch::Tensor& flat, int64_t offset, int64_t numel) {
  return grad.defined() && grad.layout() == torch::kStrided && grad.is_contiguous() &&
         grad.numel() == numel && grad.scalar_type() == flat.scalar_type() &&
         grad.data_ptr() == static_cast<char*>(flat.data_ptr()) + offset * flat.element_size();
}

}  // namespace

absl::Status BroadcastTensors(CollectiveBackend* backend, const std::vector<torch::Tensor>& tensors,
                              int src) {
  // Tensors of different dtypes cannot share one flat buffer: one broadcast per dtype run.
  std::vector<torch::Tensor> run;
  auto flush = [&]() -> absl::Status {
    absl::Status status =
        OverFlat(run, [&](torch::Tensor& flat) { return backend->Broadcast(flat, src); });
    run.clear();
    return status;
  };
  for (const torch::Tensor& t : tensors) {
    if (!run.empty() && run.back().scalar_type() != t.scalar_type()) {
      DTRAIN_RETURN_IF_ERROR(flush());
    }
    run.push_back(t);
  }
  return flush();
}

class GradientSync::ReadyHook : public torch::autograd::FunctionPostHook {
 public:
  ReadyHook(GradientSync* sync, size_t parameter) : sync_(sync), parameter_(parameter) {}
  // Runs after the accumulator has added this backward's gradient into .grad.
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    sync_->MarkReady(parameter_);
    return outputs;
  }

 private:
  GradientSync* const sync_;
  const size_t parameter_;
};

GradientSync::GradientSync(CollectiveBackend* backend, std::vector<torch::Tensor> parameters,
                           int64_t bucket_bytes, bool overlap_with_backward)
    : backend_(backend), parameters_(std::move(parameters)), overlap_(overlap_with_backward) {
  // Consecutive parameters (in reverse: the order backward produces their gradients) of one
  // dtype share a bucket until it would exceed its cap. The first bucket's lower cap only makes
  // the first all-reduce start early, so without overlap it has none.
  bucket_of_.resize(parameters_.size());
  int64_t filled = 0;
  for (size_t k = parameters_.size(); k-- > 0;) {
    const torch::Tensor& p = parameters_[k];
    const int64_t bytes = p.numel() * p.element_size();
    const int64_t cap = buckets_.size() == 1 && overlap_
                            ? std::min(bucket_bytes, kDefaultFirstBucketBytes)
                            : bucket_bytes;
    const bool new_bucket =
        buckets_.empty() || bytes > cap - filled ||
        parameters_[buckets_.back().parameters.back()].scalar_type() != p.scalar_type();
    if (new_bucket) {
      buckets_.emplace_back();
      filled = 0;
    }
    buckets_.back().parameters.push_back(k);
    bucket_of_[k] = buckets_.size() - 1;
    filled += bytes;
  }
  torch::NoGradGuard no_grad;
  for (Bucket& bucket : buckets_) {
    int64_t numel = 0;
    for (size_t i : bucket.parameters) numel += parameters_[i].numel();
    const torch::Tensor& first = parameters_[bucket.parameters.front()];
    if (first.device().is_cpu()) {
      absl::StatusOr<torch::Tensor> flat =
          backend_->AllocateForAllReduce(numel, first.scalar_type());
      if (flat.ok()) {
        bucket.flat = *std::move(flat);
      } else {
        // The plane is broken: the next collective reports it; the gradients need memory anyway.
        LogWarning(absl::StrCat("gradient bucket in ordinary memory: ", flat.status().message()),
                   {{"rank", static_cast<int64_t>(backend_->rank())}});
      }
    }
    if (!bucket.flat.defined())
      bucket.flat = torch::zeros({numel}, first.options().requires_grad(false));
    // Each gradient becomes its slice of the bucket: a tensor of its own over the bucket's
    // storage (not an autograd view: anything that detaches a gradient in place, as
    // libtorch's own zero_grad does, would refuse a view).
    int64_t offset = 0;
    for (size_t i : bucket.parameters) {
      torch::Tensor& p = parameters_[i];
      if (p.requires_grad() && p.is_contiguous()) {
        torch::Tensor slot = torch::empty({0}, bucket.flat.options())
                                 .set_(bucket.flat.storage(), bucket.flat.storage_offset() + offset,
                                       p.sizes(), p.strides());
        if (p.grad().defined()) slot.copy_(p.grad());
        p.mutable_grad() = slot;
        bucket.slots.push_back(std::move(slot));
      } else {
        bucket.slots.emplace_back();
      }
      offset += p.numel();
    }
  }
  ready_.assign(parameters_.size(), false);
  if (!overlap_) return;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    if (!parameters_[i].requires_grad()) continue;
    std::shared_ptr<torch::autograd::Node> accumulator =
        torch::autograd::impl::grad_accumulator(parameters_[i]);
    if (accumulator == nullptr) continue;
    const uintptr_t key = accumulator->add_post_hook(std::make_unique<ReadyHook>(this, i));
    hooks_.emplace_back(std::move(accumulator), key);
  }
  communication_ = std::thread([this] { CommunicationLoop(); });
}

GradientSync::~GradientSync() {
  for (auto& [accumulator, key] : hooks_) accumulator->del_post_hook(key);
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (communication_.joinable()) communication_.join();
}

absl::Status GradientSync::BroadcastParameters(int src) {
  for (const Bucket& bucket : buckets_) {
    std::vector<torch::Tensor> tensors;
    for (size_t i : bucket.parameters) tensors.push_back(parameters_[i]);
    DTRAIN_RETURN_IF_ERROR(BroadcastTensors(backend_, tensors, src));
  }
  return absl::OkStatus();
}

void GradientSync::ExpectSync() {
  absl::MutexLock lock(&mu_);
  BeginRound();
  armed_ = true;
}

void GradientSync::BeginRound() {
  // A round abandoned mid-way (backward threw) may still have buckets in flight.
  mu_.Await(absl::Condition(
      +[](GradientSync* s) ABSL_NO_THREAD_SAFETY_ANALYSIS { return s->finished_ == s->started_; },
      this));
  ready_.assign(parameters_.size(), false);
  for (Bucket& bucket : buckets_) bucket.pending = bucket.parameters.size();
  started_ = finished_ = 0;
  round_status_ = absl::OkStatus();
}

void GradientSync::MarkReady(size_t parameter) {
  absl::MutexLock lock(&mu_);
  if (!armed_ || ready_[parameter]) return;
  ready_[parameter] = true;
  --buckets_[bucket_of_[parameter]].pending;
  StartReadyBuckets();
}

bool GradientSync::PackBucket(Bucket& bucket, bool may_land) {
  torch::NoGradGuard no_grad;
  if (may_land && bucket.landing_flat.defined()) {
    // Landable: some gradient was made in its place, and every other place is free to copy into
    // (none is kept by a tensor that outlived its step; no scope is open now, so none is lent
    // meanwhile). A bucket where nothing landed is copied as before: the same copies, and a
    // gradient living in the bucket already (accumulated in place) needs none.
    // (Every parameter has a slot and a place: the split step refuses any that has not.)
    size_t made_there = 0;
    bool landable = true;
    for (size_t k = 0; k < bucket.parameters.size() && landable; ++k) {
      const torch::Tensor& grad = parameters_[bucket.parameters[k]].grad();
      made_there += landing_->Holds(grad, bucket.first_place + k);
      landable = landing_->CanPlace(bucket.first_place + k, grad);
    }
    if (landable && made_there > 0) {
      for (size_t k = 0; k < bucket.parameters.size(); ++k) {
        torch::Tensor& p = parameters_[bucket.parameters[k]];
        landing_->PlaceGradient(bucket.first_place + k, p.grad());
        // The mean lands in the bucket as always. The places are read by the reduction (the
        // peers' too) and lent again only at the next backward, after the reduction's last
        // barrier.
        p.mutable_grad() = bucket.slots[k];
      }
      ++landed_total_;
      return true;
    }
  }
  int64_t offset = 0;
  for (size_t k = 0; k < bucket.parameters.size(); ++k) {
    torch::Tensor& p = parameters_[bucket.parameters[k]];
    const int64_t n = p.numel();
    if (!LivesIn(p.grad(), bucket.flat, offset, n)) {
      const torch::Tensor& grad = p.grad();
      torch::Tensor& slot = bucket.slots[k];
      // The usual case, a new dense gradient from backward: into its slot as it is (a view
      // made per parameter and step costs about as much as a small parameter's copy).
      torch::Tensor into = slot.defined() ? slot : bucket.flat.slice(0, offset, offset + n);
      CopyGradient(grad, into);
      // Its bucket holds it now; the mean lands there. Backward is done with this parameter
      // (its bucket started once every gradient in it was ready, or backward has returned).
      if (slot.defined()) p.mutable_grad() = slot;
    }
    offset += n;
  }
  return false;
}

void GradientSync::StartReadyBuckets() {
  while (started_ + 1 < buckets_.size() && buckets_[started_].pending == 0) {
    PackBucket(buckets_[started_], /*may_land=*/false);
    ++started_;
  }
}

void GradientSync::CommunicationLoop() {
  // This thread's waits overlap backward on the same core: they must not hold the core.
  ScopedOverlappedWaits overlapped;
  // Its CUDA work (a Gloo or host copy of a bucket) runs on the parameters' device, not GPU 0.
  const CurrentDeviceScope device(parameters_.empty() ? torch::Device(torch::kCPU)
                                                      : parameters_.front().device());
  if (!device.status().ok()) LogWarning(std::string(device.status().message()));
  absl::MutexLock lock(&mu_);
  while (true) {
    mu_.Await(absl::Condition(
        +[](GradientSync* s)
             ABSL_NO_THREAD_SAFETY_ANALYSIS { return s->stopping_ || s->started_ > s->finished_; },
        this));
    if (started_ == finished_) return;  // stopping, nothing in flight
    Bucket& bucket = buckets_[finished_];
    if (round_status_.ok()) {
      // After a failure the remaining buckets are skipped: the group is broken anyway, and
      // the first error is the one worth reporting.
      mu_.Unlock();
      absl::Status status = backend_->AllReduce(bucket.flat, v1::REDUCE_OP_MEAN);
      mu_.Lock();
      if (!status.ok()) round_status_ = std::move(status);
    }
    ++finished_;
  }
}

absl::StatusOr<bool> GradientSync::PlaceParametersBesideBuckets() {
  if (overlap_) {
    return absl::FailedPreconditionError(
        "parameters beside their buckets: buckets start during backward here");
  }
  torch::NoGradGuard no_grad;
  for (Bucket& bucket : buckets_) {
    for (size_t k = 0; k < bucket.parameters.size(); ++k) {
      if (!bucket.slots[k].defined()) {
        return absl::FailedPreconditionError(
            absl::StrCat("parameters beside their buckets: parameter #", bucket.parameters[k],
                         " has no gradient in its bucket (frozen or not contiguous)"));
      }
    }
  }
  std::vector<torch::Tensor> flats;
  bool shared = true;
  for (Bucket& bucket : buckets_) {
    DTRAIN_ASSIGN_OR_RETURN(
        torch::Tensor flat,
        backend_->AllocateForAllReduce(bucket.flat.numel(), bucket.flat.scalar_type()));
    shared = shared && backend_->SharedWithPeers(flat);
    flats.push_back(std::move(flat));
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = buckets_[b];
    bucket.parameter_flat = std::move(flats[b]);
    int64_t offset = 0;
    for (size_t i : bucket.parameters) {
      torch::Tensor& p = parameters_[i];
      bucket.parameter_flat.slice(0, offset, offset + p.numel()).copy_(p.reshape({-1}));
      // The parameter itself (the module's and the optimizer's tensor) now lives there: set_
      // keeps its identity, so every holder sees the new memory.
      p.set_(bucket.parameter_flat.storage(), bucket.parameter_flat.storage_offset() + offset,
             p.sizes(), p.strides());
      offset += p.numel();
    }
  }
  if (!shared) return false;
  DTRAIN_RETURN_IF_ERROR(PlaceLandingBuffers());
  return true;
}

namespace {

// The shift, in elements of `line` to a line, that starts the most elements of `sizes` (parameter
// sizes laid out one after the other) on a line.
int64_t AligningShift(const std::vector<int64_t>& sizes, int64_t line) {
  int64_t shift = 0, best = -1;
  for (int64_t s = 0; s < line; ++s) {
    int64_t aligned = 0, offset = s;
    for (int64_t n : sizes) {
      if (offset % line == 0) aligned += n;
      offset += n;
    }
    if (aligned > best) best = aligned, shift = s;
  }
  return shift;
}

}  // namespace

absl::Status GradientSync::PlaceLandingBuffers() {
  // Only worth their memory where the peers read them in place. Without them (a full /dev/shm:
  // alike on every rank, the plane decides together) gradients are copied in. Each is a line
  // longer than its bucket: a place is lent only where it starts on c10's alignment
  // (GradientLanding), and parameters lie in their bucket at any element, so the layout is
  // shifted by the elements that align the most of them (the MLP's and CNN's large weights).
  std::vector<torch::Tensor> flats;  // each bucket's, laid out at its shift in its buffer
  bool shared = true;
  for (Bucket& bucket : buckets_) {
    const int64_t line = static_cast<int64_t>(c10::gAlignment) / bucket.flat.element_size();
    DTRAIN_ASSIGN_OR_RETURN(
        torch::Tensor buffer,
        backend_->AllocateForAllReduce(bucket.flat.numel() + line - 1, bucket.flat.scalar_type()));
    shared = shared && backend_->SharedWithPeers(buffer);
    std::vector<int64_t> sizes;
    for (size_t i : bucket.parameters) sizes.push_back(parameters_[i].numel());
    const int64_t shift = AligningShift(sizes, line);
    flats.push_back(buffer.slice(0, shift, shift + bucket.flat.numel()));
  }
  if (!shared) {
    LogWarning(
        "ddp: backward's gradients are copied into their buckets: no shared memory to make "
        "them in (the step is still split)",
        {{"rank", static_cast<int64_t>(backend_->rank())}});
    return absl::OkStatus();
  }
  std::vector<torch::Tensor> places;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = buckets_[b];
    bucket.landing_flat = std::move(flats[b]);
    bucket.first_place = places.size();
    const torch::Tensor& flat = bucket.landing_flat;
    int64_t offset = 0;
    for (size_t i : bucket.parameters) {
      const torch::Tensor& p = parameters_[i];
      places.push_back(
          torch::empty({0}, flat.options())
              .set_(flat.storage(), flat.storage_offset() + offset, p.sizes(), p.strides()));
      offset += p.numel();
    }
  }
  landing_ = std::make_unique<GradientLanding>(std::move(places));
  return absl::OkStatus();
}

absl::Status GradientSync::AverageGradientsAndUpdate(const BucketUpdate& update,
                                                     bool gradients_everywhere) {
  for (const Bucket& bucket : buckets_) {
    if (!bucket.parameter_flat.defined()) {
      return absl::FailedPreconditionError(
          "an update while averaging needs the parameters beside their buckets");
    }
  }
  return Average(&update, gradients_everywhere);
}

absl::Status GradientSync::Average(const BucketUpdate* update, bool gradients_everywhere) {
  absl::Status status;
  absl::Time start = absl::Now();
  size_t first_here = 0;
  {
    absl::MutexLock lock(&mu_);
    if (!armed_) BeginRound();
    armed_ = false;
    // The buckets backward started finish on the communication thread; the rest run here, in
    // bucket order after them: handing them over now would only add a wake-up per bucket while
    // this thread waits anyway.
    mu_.Await(absl::Condition(
        +[](GradientSync* s) ABSL_NO_THREAD_SAFETY_ANALYSIS { return s->finished_ == s->started_; },
        this));
    status = round_status_;
    // Hooks that fire from here on return at once (not armed); the counters stay as they are
    // until the next round begins.
    first_here = started_;
    ++rounds_;
    overlapped_total_ += started_;
  }
  for (size_t b = first_here; status.ok() && b < buckets_.size(); ++b) {
    // Copying a bucket's new gradients in is this rank's own work, not a wait.
    const absl::Time packing = absl::Now();
    const bool landed = PackBucket(buckets_[b], /*may_land=*/update != nullptr);
    start += absl::Now() - packing;
    if (update == nullptr) {
      status = backend_->AllReduce(buckets_[b].flat, v1::REDUCE_OP_MEAN);
      continue;
    }
    // The update is this rank's own work too (the optimizer's), not a wait.
    status = backend_->AllReduceThenUpdate(
        buckets_[b].flat, v1::REDUCE_OP_MEAN, buckets_[b].parameter_flat,
        [&](int64_t begin, int64_t end) {
          const absl::Time updating = absl::Now();
          absl::Status updated = (*update)(b, begin, end);
          const absl::Duration spent = absl::Now() - updating;
          start += spent;
          update_time_ += spent;
          return updated;
        },
        landed ? buckets_[b].landing_flat : torch::Tensor(), gradients_everywhere);
  }
  exposed_wait_ += absl::Now() - start;
  if (!status.ok()) return status;
  torch::NoGradGuard no_grad;
  for (const Bucket& bucket : buckets_) {
    int64_t offset = 0;
    for (size_t k = 0; k < bucket.parameters.size(); ++k) {
      torch::Tensor& p = parameters_[bucket.parameters[k]];
      const int64_t n = p.numel();
      // A slotted gradient points at its slice since PackBucket. A frozen parameter gets no
      // gradient: the optimizer would otherwise step it (weight decay), as single_device does not.
      if (!bucket.slots[k].defined() && p.requires_grad() &&
          !LivesIn(p.grad(), bucket.flat, offset, n)) {
        if (!p.grad().defined() || p.grad().is_sparse()) p.mutable_grad() = torch::zeros_like(p);
        p.mutable_grad().copy_(bucket.flat.slice(0, offset, offset + n).view(p.sizes()));
      }
      offset += n;
    }
  }
  return absl::OkStatus();
}

void GradientSync::WaitForInFlight() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](GradientSync* s) ABSL_NO_THREAD_SAFETY_ANALYSIS { return s->finished_ == s->started_; },
      this));
}

size_t GradientSync::started_during_backward() const {
  absl::MutexLock lock(&mu_);
  return started_;
}

}  // namespace dtrain
