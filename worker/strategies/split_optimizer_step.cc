#include "worker/strategies/split_optimizer_step.h"

#include <algorithm>
#include <array>
#include <optional>
#include <string>
#include <utility>

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

// Two descriptions of what is held of a parameter (-1: no elements; 0: elements but no state;
// else 1 + a bit per state tensor defined) merged: the tensors either holds.
int64_t MergeHeld(int64_t a, int64_t b) {
  if (a > 0 && b > 0) return 1 + ((a - 1) | (b - 1));
  return std::max(a, b);
}

// `count` elements of `state`'s tensors from element `from`, each a tensor of its own.
ElementwiseState SliceOf(const ElementwiseState& state, int64_t from, int64_t count) {
  ElementwiseState part{{}, state.step};
  for (size_t t = 0; t < ElementwiseState::kTensors; ++t) {
    if (state.tensors[t].defined()) {
      part.tensors[t] = state.tensors[t].reshape({-1}).slice(0, from, from + count).clone();
    }
  }
  return part;
}

// Whether two parameters' states (none, or tensors and a step count) may continue as one
// tensor's: both none, or the same tensors defined and the same step count.
bool Alike(const std::optional<ElementwiseState>& a, const std::optional<ElementwiseState>& b) {
  if (a.has_value() != b.has_value()) return false;
  if (!a.has_value()) return true;
  if (a->step != b->step) return false;
  for (size_t t = 0; t < ElementwiseState::kTensors; ++t) {
    if (a->tensors[t].defined() != b->tensors[t].defined()) return false;
  }
  return true;
}

// `pieces` (the same tensors defined, the same step count) end to end.
ElementwiseState Joined(const std::vector<ElementwiseState>& pieces) {
  if (pieces.size() == 1) return pieces.front();
  ElementwiseState joined{{}, pieces.front().step};
  for (size_t t = 0; t < ElementwiseState::kTensors; ++t) {
    if (!pieces.front().tensors[t].defined()) continue;
    std::vector<torch::Tensor> parts;
    for (const ElementwiseState& piece : pieces) parts.push_back(piece.tensors[t]);
    joined.tensors[t] = torch::cat(parts);
  }
  return joined;
}

}  // namespace

bool SplitOptimizerStep::Splits(const torch::optim::Optimizer& optimizer) {
  return ElementwiseOptimizer::Of(optimizer) != nullptr;
}

SplitOptimizerStep::SplitOptimizerStep(torch::optim::Optimizer* full, const GradientSync* sync,
                                       std::vector<torch::Tensor> parameters)
    : full_(full),
      kind_(ElementwiseOptimizer::Of(*full)),
      sync_(sync),
      parameters_(std::move(parameters)) {
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
  DTRAIN_RETURN_IF_ERROR(GuardTorch("cannot split the optimizer step", [&]() -> absl::Status {
    // The slices and the runs they form, each run with its slices' parts of the state the full
    // optimizer has for their parameters (a restored or consolidated one, which the part
    // continues from).
    std::vector<std::vector<ElementwiseState>> run_states;
    std::optional<ElementwiseState> previous;  // the last slice's parameter's
    int64_t offset = 0;
    for (size_t i : sync_->parameters_in_bucket(bucket)) {
      const int64_t n = parameters_[i].numel();
      const int64_t lo = std::max(begin, offset), hi = std::min(end, offset + n);
      const int g = group_of_[i];
      const int64_t from = lo - offset;
      offset += n;
      if (lo >= hi || g < 0) continue;
      std::optional<ElementwiseState> state = kind_->Read(*full_, parameters_[i]);
      if (part.runs.empty() || part.runs.back().group != g ||
          part.runs.back().begin + part.runs.back().count != lo || !Alike(state, previous)) {
        part.runs.push_back(Run{torch::Tensor(), g, lo, 0});
        run_states.emplace_back();
      }
      Run& run = part.runs.back();
      part.slices.push_back(Slice{i, from, hi - lo, part.runs.size() - 1, run.count});
      run.count += hi - lo;
      if (state.has_value()) run_states.back().push_back(SliceOf(*state, from, hi - lo));
      previous = std::move(state);
    }
    // Per group of the full optimizer that has elements here: the part's group.
    std::vector<int> part_group(full_->param_groups().size(), -1);
    std::vector<std::vector<torch::Tensor>> group_params;
    for (Run& run : part.runs) {
      run.value = ElementsOf(values, run.begin, run.count);
      run.value.mutable_grad() = ElementsOf(grads, run.begin, run.count);
      if (part_group[run.group] < 0) {
        part_group[run.group] = static_cast<int>(part.groups.size());
        part.groups.push_back(static_cast<size_t>(run.group));
        group_params.emplace_back();
      }
      group_params[part_group[run.group]].push_back(run.value);
    }
    std::vector<torch::optim::OptimizerParamGroup> groups;
    for (size_t j = 0; j < part.groups.size(); ++j) {
      groups.emplace_back(group_params[j], full_->param_groups()[part.groups[j]].options().clone());
    }
    if (groups.empty()) return absl::OkStatus();
    part.optimizer = kind_->Make(std::move(groups), *full_);
    for (size_t r = 0; r < part.runs.size(); ++r) {
      if (!run_states[r].empty()) {
        kind_->Write(*part.optimizer, part.runs[r].value, Joined(run_states[r]));
      }
    }
    return absl::OkStatus();
  }));
  parts_.push_back(std::move(part));
  return &parts_.back();
}

absl::Status SplitOptimizerStep::Update(size_t bucket, int64_t begin, int64_t end) {
  return GuardTorch("optimizer step failed", [&]() -> absl::Status {
    if (kind_ == nullptr) return absl::InternalError("the optimizer's step cannot be split");
    DTRAIN_ASSIGN_OR_RETURN(Part * part, PartFor(bucket, begin, end));
    if (part->optimizer == nullptr) return absl::OkStatus();  // nothing here the optimizer steps
    // Rates as the schedulers left them on the full optimizer.
    for (size_t j = 0; j < part->groups.size(); ++j) {
      kind_->CopyOptions(full_->param_groups()[part->groups[j]].options(),
                         part->optimizer->param_groups()[j].options());
    }
    part->optimizer->step();
    return absl::OkStatus();
  });
}

absl::Status SplitOptimizerStep::Consolidate(CollectiveBackend* backend) {
  if (kind_ == nullptr) return absl::InternalError("the optimizer's step cannot be split");
  constexpr size_t kTensors = ElementwiseState::kTensors;
  const int world = backend->world_size();
  for (size_t b = 0; b < sync_->bucket_count(); ++b) {
    const std::vector<size_t>& in_bucket = sync_->parameters_in_bucket(b);
    const size_t params = in_bucket.size();
    // What this rank holds of the bucket: its parts' ranges; per parameter what it has there
    // (-1: no elements; 0: elements but no state; else 1 + a bit per tensor the state defines);
    // and per parameter its state's step count.
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
    std::vector<int64_t> offsets;
    int64_t offset = 0;
    for (size_t i : in_bucket) {
      offsets.push_back(offset);
      offset += parameters_[i].numel();
    }
    std::vector<int64_t> has(params, -1), steps(params, 0);
    std::array<torch::Tensor, kTensors> whole;  // per state tensor: the bucket's elements
    for (const Part* part : mine) {
      std::vector<std::optional<ElementwiseState>> run_held(part->runs.size());
      if (part->optimizer != nullptr) {
        for (size_t r = 0; r < part->runs.size(); ++r) {
          run_held[r] = kind_->Read(*part->optimizer, part->runs[r].value);
        }
      }
      for (const Slice& slice : part->slices) {
        const size_t k = static_cast<size_t>(
            std::find(in_bucket.begin(), in_bucket.end(), slice.parameter) - in_bucket.begin());
        const std::optional<ElementwiseState>& held = run_held[slice.run];
        int64_t bits = 0;
        if (held.has_value()) {
          for (size_t t = 0; t < kTensors; ++t) {
            if (!held->tensors[t].defined()) continue;
            bits |= int64_t{1} << t;
            if (!whole[t].defined()) whole[t] = torch::zeros({grads.numel()}, grads.options());
            const int64_t at = offsets[k] + slice.from;
            whole[t]
                .slice(0, at, at + slice.count)
                .copy_(held->tensors[t].reshape({-1}).slice(0, slice.at, slice.at + slice.count));
          }
          steps[k] = held->step;
        }
        has[k] = MergeHeld(has[k], held.has_value() ? 1 + bits : 0);
      }
    }
    row.insert(row.end(), has.begin(), has.end());
    row.insert(row.end(), steps.begin(), steps.end());
    DTRAIN_ASSIGN_OR_RETURN(std::vector<torch::Tensor> rows,
                            backend->AllGather(torch::tensor(row, torch::kInt64)));
    // Per parameter: the union of what the ranks have, and the step count they agree on.
    std::vector<int64_t> any(params, -1), step(params, -1);
    std::vector<std::vector<std::pair<int64_t, int64_t>>> ranges(world);
    int64_t tensors_anywhere = 0;
    for (int r = 0; r < world; ++r) {
      const int64_t numel = rows[r].numel();
      const int64_t* got = rows[r].data_ptr<int64_t>();
      const int64_t count = numel > 0 ? got[0] : -1;
      if (count < 0 || count > numel / 2 ||
          numel != 1 + 2 * count + 2 * static_cast<int64_t>(params)) {
        return absl::InternalError(absl::StrCat("optimizer state of rank ", r,
                                                " does not describe bucket ", b, " as this one"));
      }
      for (int64_t j = 0; j < count; ++j) ranges[r].emplace_back(got[1 + 2 * j], got[2 + 2 * j]);
      const int64_t* their_has = got + 1 + 2 * count;
      const int64_t* their_steps = their_has + params;
      for (size_t k = 0; k < params; ++k) {
        if (their_has[k] > 0) {
          if (step[k] >= 0 && step[k] != their_steps[k]) {
            return absl::InternalError(absl::StrCat(
                "the ranks' optimizer states disagree on the step count of a parameter in bucket ",
                b, ": ", step[k], " against ", their_steps[k], " on rank ", r));
          }
          step[k] = their_steps[k];
          tensors_anywhere |= their_has[k] - 1;
        }
        any[k] = MergeHeld(any[k], their_has[k]);
      }
    }
    // Each range of each tensor some rank keeps, from the rank that stepped it, in rank order
    // on every rank.
    for (size_t t = 0; t < kTensors; ++t) {
      if ((tensors_anywhere & (int64_t{1} << t)) == 0) continue;
      if (!whole[t].defined()) whole[t] = torch::zeros({grads.numel()}, grads.options());
      for (int r = 0; r < world; ++r) {
        for (const auto& [lo, hi] : ranges[r]) {
          if (lo < 0 || hi < lo || hi > grads.numel()) {
            return absl::InternalError(absl::StrCat("rank ", r, " describes a part [", lo, ", ", hi,
                                                    ") outside bucket ", b));
          }
          torch::Tensor range = whole[t].slice(0, lo, hi);
          DTRAIN_RETURN_IF_ERROR(backend->Broadcast(range, r));
        }
      }
    }
    for (size_t k = 0; k < params; ++k) {
      const torch::Tensor& p = parameters_[in_bucket[k]];
      // No rank stepped it since a restore (or ever): the full optimizer's state stands.
      if (any[k] < 0) continue;
      if (any[k] == 0) {
        full_->state().erase(OptimizerStateKey(p));
        continue;
      }
      ElementwiseState state{{}, step[k]};
      for (size_t t = 0; t < kTensors; ++t) {
        if (((any[k] - 1) & (int64_t{1} << t)) == 0) continue;
        state.tensors[t] =
            whole[t].slice(0, offsets[k], offsets[k] + p.numel()).view(p.sizes()).clone();
      }
      kind_->Write(*full_, p, state);
    }
  }
  return absl::OkStatus();
}

}  // namespace dtrain
