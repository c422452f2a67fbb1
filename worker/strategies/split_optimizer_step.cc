#include "worker/strategies/split_optimizer_step.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/model/optimizers.h"
#include "worker/model/torch_status.h"

namespace dtrain {
namespace {

// A tensor of its own over `count` elements of `flat` from element `at` (not an autograd view:
// it becomes an optimizer's parameter, and its .grad is another such tensor).
torch::Tensor ElementsOf(const torch::Tensor& flat, int64_t at, int64_t count) {
  return torch::empty({0}, flat.options())
      .set_(flat.storage(), flat.storage_offset() + at, {count}, {1});
}

const torch::Tensor* MomentumOf(const torch::optim::Optimizer& optimizer,
                                const torch::Tensor& parameter) {
  auto it = optimizer.state().find(OptimizerStateKey(parameter));
  if (it == optimizer.state().end()) return nullptr;
  const auto& state = static_cast<const torch::optim::SGDParamState&>(*it->second);
  return state.momentum_buffer().defined() ? &state.momentum_buffer() : nullptr;
}

}  // namespace

bool SplitOptimizerStep::Splits(const torch::optim::Optimizer& optimizer) {
  return dynamic_cast<const torch::optim::SGD*>(&optimizer) != nullptr;
}

SplitOptimizerStep::SplitOptimizerStep(torch::optim::Optimizer* full, const GradientSync* sync,
                                       std::vector<torch::Tensor> parameters)
    : full_(full), sync_(sync), parameters_(std::move(parameters)) {
  group_of_.assign(parameters_.size(), -1);
  for (size_t g = 0; g < full_->param_groups().size(); ++g) {
    for (const torch::Tensor& p : full_->param_groups()[g].params()) {
      for (size_t i = 0; i < parameters_.size(); ++i) {
        if (parameters_[i].unsafeGetTensorImpl() == p.unsafeGetTensorImpl()) {
          group_of_[i] = static_cast<int>(g);
        }
      }
    }
  }
}

absl::StatusOr<SplitOptimizerStep::Part*> SplitOptimizerStep::PartFor(size_t bucket, int64_t begin,
                                                                      int64_t end) {
  for (Part& part : parts_) {
    if (part.bucket == bucket && part.begin == begin && part.end == end) return &part;
  }
  Part part;
  part.bucket = bucket;
  part.begin = begin;
  part.end = end;
  const torch::Tensor& grads = sync_->bucket_flat(bucket);
  const torch::Tensor& values = sync_->bucket_parameters(bucket);
  // Per group of the full optimizer that has elements here: the part's group.
  std::vector<int> part_group(full_->param_groups().size(), -1);
  std::vector<std::vector<torch::Tensor>> group_params;
  int64_t offset = 0;
  for (size_t i : sync_->parameters_in_bucket(bucket)) {
    const int64_t n = parameters_[i].numel();
    const int64_t lo = std::max(begin, offset), hi = std::min(end, offset + n);
    const int g = group_of_[i];
    if (lo < hi && g >= 0) {
      Slice slice{i, lo - offset, ElementsOf(values, lo, hi - lo)};
      slice.value.mutable_grad() = ElementsOf(grads, lo, hi - lo);
      if (part_group[g] < 0) {
        part_group[g] = static_cast<int>(part.groups.size());
        part.groups.push_back(static_cast<size_t>(g));
        group_params.emplace_back();
      }
      group_params[part_group[g]].push_back(slice.value);
      part.slices.push_back(std::move(slice));
    }
    offset += n;
  }
  DTRAIN_RETURN_IF_ERROR(GuardTorch("cannot split the optimizer step", [&]() -> absl::Status {
    std::vector<torch::optim::OptimizerParamGroup> groups;
    for (size_t j = 0; j < part.groups.size(); ++j) {
      groups.emplace_back(group_params[j], full_->param_groups()[part.groups[j]].options().clone());
    }
    if (groups.empty()) return absl::OkStatus();
    // Neutral defaults: every group has its own options, and the constructor's checks of the
    // defaults must not refuse what a scheduler made of the job's (momentum 0 with Nesterov).
    part.sgd = std::make_unique<torch::optim::SGD>(std::move(groups), torch::optim::SGDOptions(0));
    // A restored (or consolidated) momentum continues where the full optimizer has it.
    for (const Slice& slice : part.slices) {
      const torch::Tensor* momentum = MomentumOf(*full_, parameters_[slice.parameter]);
      if (momentum == nullptr) continue;
      auto state = std::make_unique<torch::optim::SGDParamState>();
      state->momentum_buffer(
          momentum->reshape({-1}).slice(0, slice.from, slice.from + slice.value.numel()).clone());
      part.sgd->state()[OptimizerStateKey(slice.value)] = std::move(state);
    }
    return absl::OkStatus();
  }));
  parts_.push_back(std::move(part));
  return &parts_.back();
}

absl::Status SplitOptimizerStep::Update(size_t bucket, int64_t begin, int64_t end) {
  return GuardTorch("optimizer step failed", [&]() -> absl::Status {
    DTRAIN_ASSIGN_OR_RETURN(Part * part, PartFor(bucket, begin, end));
    if (part->sgd == nullptr) return absl::OkStatus();  // nothing here the optimizer steps
    // Rates as the schedulers left them on the full optimizer.
    for (size_t j = 0; j < part->groups.size(); ++j) {
      static_cast<torch::optim::SGDOptions&>(part->sgd->param_groups()[j].options()) =
          static_cast<const torch::optim::SGDOptions&>(
              full_->param_groups()[part->groups[j]].options());
    }
    part->sgd->step();
    return absl::OkStatus();
  });
}

absl::Status SplitOptimizerStep::Consolidate(CollectiveBackend* backend) {
  const int world = backend->world_size();
  for (size_t b = 0; b < sync_->bucket_count(); ++b) {
    const std::vector<size_t>& in_bucket = sync_->parameters_in_bucket(b);
    // What this rank holds of the bucket: its parts' ranges, and per parameter whether it has
    // momentum there (1), has none (0) or has no elements of it (-1).
    std::vector<int64_t> row;
    std::vector<const Part*> mine;
    for (const Part& part : parts_) {
      if (part.bucket == b) mine.push_back(&part);
    }
    row.push_back(static_cast<int64_t>(mine.size()));
    for (const Part* part : mine) {
      row.push_back(part->begin);
      row.push_back(part->end);
    }
    const torch::Tensor& grads = sync_->bucket_flat(b);
    torch::Tensor momentum = torch::zeros({grads.numel()}, grads.options());
    std::vector<int64_t> has(in_bucket.size(), -1);
    std::vector<int64_t> offsets;
    int64_t offset = 0;
    for (size_t i : in_bucket) {
      offsets.push_back(offset);
      offset += parameters_[i].numel();
    }
    for (const Part* part : mine) {
      for (const Slice& slice : part->slices) {
        const size_t k = static_cast<size_t>(
            std::find(in_bucket.begin(), in_bucket.end(), slice.parameter) - in_bucket.begin());
        const torch::Tensor* held =
            part->sgd == nullptr ? nullptr : MomentumOf(*part->sgd, slice.value);
        if (held != nullptr) {
          momentum.slice(0, offsets[k] + slice.from, offsets[k] + slice.from + held->numel())
              .copy_(*held);
        }
        has[k] = std::max<int64_t>(has[k], held != nullptr ? 1 : 0);
      }
    }
    row.insert(row.end(), has.begin(), has.end());
    DTRAIN_ASSIGN_OR_RETURN(std::vector<torch::Tensor> rows,
                            backend->AllGather(torch::tensor(row, torch::kInt64)));
    std::vector<int64_t> any(in_bucket.size(), 0);
    for (int r = 0; r < world; ++r) {
      const int64_t* got = rows[r].data_ptr<int64_t>();
      const int64_t count = got[0];
      if (rows[r].numel() != 1 + 2 * count + static_cast<int64_t>(in_bucket.size())) {
        return absl::InternalError(absl::StrCat("optimizer state of rank ", r,
                                                " does not describe bucket ", b, " as this one"));
      }
      for (size_t k = 0; k < in_bucket.size(); ++k) {
        any[k] = std::max(any[k], got[1 + 2 * count + static_cast<int64_t>(k)]);
      }
      // Each range from the rank that stepped it, in rank order on every rank.
      for (int64_t j = 0; j < count; ++j) {
        torch::Tensor range = momentum.slice(0, got[1 + 2 * j], got[2 + 2 * j]);
        DTRAIN_RETURN_IF_ERROR(backend->Broadcast(range, r));
      }
    }
    for (size_t k = 0; k < in_bucket.size(); ++k) {
      const torch::Tensor& p = parameters_[in_bucket[k]];
      // No rank stepped it since a restore (or ever): the full optimizer's state stands.
      if (any[k] < 0) continue;
      if (any[k] == 0) {
        full_->state().erase(OptimizerStateKey(p));
        continue;
      }
      auto state = std::make_unique<torch::optim::SGDParamState>();
      state->momentum_buffer(
          momentum.slice(0, offsets[k], offsets[k] + p.numel()).view(p.sizes()).clone());
      full_->state()[OptimizerStateKey(p)] = std::move(state);
    }
  }
  return absl::OkStatus();
}

}  // namespace dtrain
