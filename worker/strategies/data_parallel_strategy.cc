#include "worker/strategies/data_parallel_strategy.h"

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/model/batch_tree.h"
#include "worker/model/model_thread_scope.h"
#include "worker/model/step_kind.h"
#include "worker/model/torch_status.h"
#include "worker/strategies/module_replica.h"

namespace dtrain {

absl::StatusOr<std::unique_ptr<Strategy>> DataParallelStrategy::Make(
    const StrategyOptions& options, std::unique_ptr<CollectiveBackend> backend) {
  if (options.devices < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("dp needs at least one device, got ", options.devices));
  }
  if (!options.replica_devices.empty() &&
      static_cast<int>(options.replica_devices.size()) != options.devices) {
    return absl::InternalError(absl::StrCat("dp: ", options.replica_devices.size(),
                                            " replica devices for ", options.devices, " replicas"));
  }
  return std::unique_ptr<Strategy>(new DataParallelStrategy(options, std::move(backend)));
}

bool DataParallelStrategy::replicated() const {
  for (const torch::Device& d : options_.replica_devices) {
    if (d != options_.device) return true;
  }
  return false;
}

absl::StatusOr<LightningModule*> DataParallelStrategy::Replica(int i) {
  if (i == 0 || !replicated()) return &model();
  if (replicas_.empty()) replicas_.resize(options_.devices);
  if (replicas_[i] == nullptr) {
    DTRAIN_ASSIGN_OR_RETURN(replicas_[i],
                            ModuleReplica::Make(&model(), options_.replica_devices[i]));
  }
  DTRAIN_RETURN_IF_ERROR(replicas_[i]->Bind());
  return &replicas_[i]->module();
}

c10::IValue DataParallelStrategy::ToReplica(const c10::IValue& part, int i) const {
  if (!replicated()) return part;
  const torch::Device device = options_.replica_devices[i];
  return MapTensors(part,
                    [&](const at::Tensor& t) { return t.device() == device ? t : t.to(device); });
}

c10::IValue DataParallelStrategy::ReduceCollection(const c10::IValue& collection) {
  return MapTensors(collection, [](const at::Tensor& t) {
    // As Lightning's: integer (and half) tensors averaged in float and cast back; float64 keeps
    // its precision.
    if (t.scalar_type() == at::kDouble) return t.mean();
    return t.to(at::kFloat).mean().to(t.scalar_type());
  });
}

absl::StatusOr<c10::IValue> DataParallelStrategy::Gather(const std::vector<c10::IValue>& outputs,
                                                         torch::Device device) {
  if (outputs.empty()) return absl::InvalidArgumentError("dp gather: no outputs");
  const c10::IValue& first = outputs.front();
  if (first.isTensor()) {
    std::vector<at::Tensor> tensors;
    bool scalars = true;
    for (const c10::IValue& out : outputs) {
      if (!out.isTensor()) {
        return absl::InvalidArgumentError(
            absl::StrCat("dp gather: one replica returned a tensor, another a ", out.tagKind()));
      }
      tensors.push_back(out.toTensor().to(device));
      scalars = scalars && tensors.back().dim() == 0;
    }
    return GuardTorch("dp gather", [&]() -> absl::StatusOr<c10::IValue> {
      return scalars ? at::stack(tensors) : at::cat(tensors);
    });
  }
  if (first.isGenericDict()) {
    const c10::impl::GenericDict dict = first.toGenericDict();
    c10::impl::GenericDict gathered(dict.keyType(), dict.valueType());
    for (const auto& entry : dict) {
      std::vector<c10::IValue> values;
      for (const c10::IValue& out : outputs) {
        if (!out.isGenericDict() || !out.toGenericDict().contains(entry.key())) {
          return absl::InvalidArgumentError(
              "dp gather: the replicas returned dicts with different keys");
        }
        values.push_back(out.toGenericDict().at(entry.key()));
      }
      DTRAIN_ASSIGN_OR_RETURN(c10::IValue value, Gather(values, device));
      gathered.insert(entry.key(), std::move(value));
    }
    return c10::IValue(gathered);
  }
  if (first.isTuple()) {
    std::vector<c10::IValue> items;
    const size_t n = first.toTupleRef().elements().size();
    for (size_t k = 0; k < n; ++k) {
      std::vector<c10::IValue> values;
      for (const c10::IValue& out : outputs) {
        if (!out.isTuple() || out.toTupleRef().elements().size() != n) {
          return absl::InvalidArgumentError(
              "dp gather: the replicas returned tuples of different lengths");
        }
        values.push_back(out.toTupleRef().elements()[k]);
      }
      DTRAIN_ASSIGN_OR_RETURN(c10::IValue item, Gather(values, device));
      items.push_back(std::move(item));
    }
    return c10::IValue(c10::ivalue::Tuple::create(std::move(items)));
  }
  return first;  // numbers, strings, None: as replica 0 returned them
}

absl::StatusOr<c10::IValue> DataParallelStrategy::RunReplicas(const std::string& method,
                                                              const c10::IValue& batch,
                                                              int64_t idx) {
  DTRAIN_ASSIGN_OR_RETURN(std::vector<c10::IValue> parts, SplitBatch(batch, options_.devices));
  std::vector<c10::IValue> outputs;
  for (int i = 0; i < static_cast<int>(parts.size()); ++i) {
    DTRAIN_ASSIGN_OR_RETURN(LightningModule * replica, Replica(i));
    // Model code's implicit CUDA work lands on the replica's device, as parallel_apply does.
    const ModelThreadScope scope(options_.replica_devices.empty() ? options_.device
                                                                  : options_.replica_devices[i]);
    DTRAIN_RETURN_IF_ERROR(scope.status());
    DTRAIN_ASSIGN_OR_RETURN(c10::IValue out, replica->RawStep(method, ToReplica(parts[i], i), idx));
    outputs.push_back(std::move(out));
  }
  // Gathered on the root device, where the optimizer's parameters are.
  return Gather(outputs, options_.device);
}

absl::StatusOr<torch::Tensor> DataParallelStrategy::TrainingStep(const c10::IValue& batch,
                                                                 int64_t idx) {
  DTRAIN_ASSIGN_OR_RETURN(c10::IValue gathered, RunReplicas("training_step", batch, idx));
  if (model().HasMethod("training_step_end")) {
    DTRAIN_ASSIGN_OR_RETURN(c10::IValue out, model().StepEnd("training_step", gathered));
    return model().TrainingLoss(out);
  }
  return model().TrainingLoss(ReduceCollection(gathered));
}

absl::StatusOr<StepOutput> DataParallelStrategy::EvalStep(StepKind kind, const c10::IValue& batch,
                                                          int64_t idx) {
  if (kind == StepKind::kTraining) return Strategy::EvalStep(kind, batch, idx);
  const std::string method = StepMethodName(kind);
  DTRAIN_ASSIGN_OR_RETURN(c10::IValue out, RunReplicas(method, batch, idx));
  if (kind != StepKind::kPredict) {
    if (model().HasMethod(method + "_end")) {
      DTRAIN_ASSIGN_OR_RETURN(out, model().StepEnd(method, out));
    } else {
      out = ReduceCollection(out);
    }
  }
  return model().ToStepOutput(method, out);
}

absl::Status DataParallelStrategy::Reduce(torch::Tensor& tensor, v1::ReduceOp op) {
  return GuardTorch("dp reduce", [&]() -> absl::Status {
    tensor = ReduceCollection(tensor).toTensor();
    return absl::OkStatus();
  });
}

}  // namespace dtrain
