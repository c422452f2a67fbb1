#include "worker/model/lightning_module.h"

#include <cmath>
#include <fstream>
#include <optional>
#include <unordered_set>

#include <torch/csrc/jit/api/function_impl.h>
#include <yaml-cpp/yaml.h>

#include "absl/strings/str_cat.h"
#include "common/yaml_float.h"
#include "worker/model/tensor_convert.h"
#include "worker/model/torch_status.h"

namespace dtrain {
namespace {

constexpr char kExportHint[] =
    "; export a LightningModule with @torch.jit.export on training_step (and the other "
    "step methods) and save it with torch.jit.save(torch.jit.script(model), path); see "
    "docs/models.md";

// Where dtrain.export() puts configure_optimizers' recipe (torch.jit.save's _extra_files).
constexpr char kOptimizationFile[] = "dtrain/optimization.json";

// Whether code in `block` may read a tensor's .grad, following the calls it makes (methods,
// scripted functions, fork subgraphs) into their own graphs. It follows them itself rather than
// relying on torch::jit::Inline, which inlines a callee's optimized graph: with the graph
// executor's optimization off (a job's CPU threads, ScriptExecutionScope) that graph still holds
// its own calls. A call it cannot follow (an interface's method, a builtin) counts as a read.
bool BlockReadsGradients(const torch::jit::Block* block,
                         std::unordered_set<const torch::jit::Graph*>& seen);

bool GraphReadsGradients(const torch::jit::Graph& graph,
                         std::unordered_set<const torch::jit::Graph*>& seen) {
  if (!seen.insert(&graph).second) return false;  // already scanned (or being scanned)
  return BlockReadsGradients(graph.block(), seen);
}

bool FunctionReadsGradients(torch::jit::Function& function,
                            std::unordered_set<const torch::jit::Graph*>& seen) {
  torch::jit::GraphFunction* graph = torch::jit::tryToGraphFunction(function);
  return graph == nullptr || GraphReadsGradients(*graph->graph(), seen);
}

bool BlockReadsGradients(const torch::jit::Block* block,
                         std::unordered_set<const torch::jit::Graph*>& seen) {
  for (const torch::jit::Node* node : block->nodes()) {
    if (node->kind() == c10::prim::grad) return true;
    if (node->kind() == c10::prim::CallMethod) {
      c10::ClassTypePtr type = node->input(0)->type()->cast<c10::ClassType>();
      torch::jit::Function* method =
          type == nullptr ? nullptr : type->findMethod(node->s(c10::attr::name));
      if (method == nullptr || FunctionReadsGradients(*method, seen)) return true;
    }
    if (node->kind() == c10::prim::CallFunction) {
      c10::FunctionTypePtr type = node->input(0)->type()->cast<c10::FunctionType>();
      if (type == nullptr || FunctionReadsGradients(*type->function(), seen)) return true;
    }
    for (const torch::jit::Block* inner : node->blocks()) {
      if (BlockReadsGradients(inner, seen)) return true;
    }
    // torch.jit.fork's function is a subgraph attribute, not a block.
    if (node->hasAttribute(c10::attr::Subgraph) &&
        GraphReadsGradients(*node->g(c10::attr::Subgraph), seen)) {
      return true;
    }
  }
  return false;
}

}  // namespace

absl::StatusOr<LightningModule> LightningModule::Load(const std::string& path) {
  if (!std::ifstream(path).good()) {
    return absl::NotFoundError(
        absl::StrCat("model file '", path, "' does not exist or cannot be read"));
  }
  torch::jit::ExtraFilesMap extra{{std::string(kOptimizationFile), ""}};
  absl::StatusOr<torch::jit::Module> module =
      GuardTorch(absl::StrCat("cannot load '", path, "' as a TorchScript module"),
                 [&]() -> absl::StatusOr<torch::jit::Module> {
                   // On the CPU, as map_location="cpu": the accelerator moves it to the
                   // rank's own device (a module saved on cuda:k would otherwise go to cuda:k,
                   // or fail on a worker without CUDA).
                   return torch::jit::load(path, c10::Device(c10::kCPU), extra);
                 });
  if (!module.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(module.status().message(), kExportHint));
  }
  absl::StatusOr<LightningModule> wrapped = Wrap(std::move(*module), path);
  if (wrapped.ok()) wrapped->optimization_json_ = extra[kOptimizationFile];
  return wrapped;
}

LightningModule::LightningModule(torch::jit::Module module, std::string origin)
    : module_(std::move(module)), origin_(std::move(origin)) {
  if (HasAttribute("current_epoch", c10::TypeKind::IntType)) {
    epoch_slot_ = module_.type()->getAttributeSlot("current_epoch");
  }
  if (HasAttribute("global_step", c10::TypeKind::IntType)) {
    global_step_slot_ = module_.type()->getAttributeSlot("global_step");
  }
}

std::vector<torch::Tensor> LightningModule::Parameters() const {
  std::vector<torch::Tensor> out;
  for (const torch::Tensor& p : module_.parameters()) out.push_back(p);
  return out;
}

absl::StatusOr<LightningModule> LightningModule::Wrap(torch::jit::Module module,
                                                      std::string origin) {
  if (!module.find_method("training_step").has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model '", origin, "' has no training_step(batch, batch_idx) method", kExportHint));
  }
  return LightningModule(std::move(module), std::move(origin));
}

bool LightningModule::HasMethod(const std::string& name) const {
  return module_.find_method(name).has_value();
}

bool LightningModule::HasAttribute(const std::string& name, c10::TypeKind kind) const {
  const c10::ClassTypePtr type = module_.type();
  return type->hasAttribute(name) && type->getAttribute(name)->kind() == kind;
}

void LightningModule::SetLoopState(int64_t epoch, int64_t global_step) {
  // By slot, found once: a TorchScript class finds an attribute by comparing names one by one,
  // and this runs every step.
  if (epoch_slot_.has_value()) module_._ivalue()->setSlot(*epoch_slot_, epoch);
  if (global_step_slot_.has_value()) module_._ivalue()->setSlot(*global_step_slot_, global_step);
}

void LightningModule::CopyLoopStateFrom(const LightningModule& source) {
  if (epoch_slot_.has_value() && source.epoch_slot_.has_value()) {
    module_._ivalue()->setSlot(*epoch_slot_,
                               source.module_._ivalue()->getSlot(*source.epoch_slot_));
  }
  if (global_step_slot_.has_value() && source.global_step_slot_.has_value()) {
    module_._ivalue()->setSlot(*global_step_slot_,
                               source.module_._ivalue()->getSlot(*source.global_step_slot_));
  }
}

void LightningModule::SetDevice(const c10::Device& device) {
  if (HasAttribute("device", c10::TypeKind::DeviceObjType)) module_.setattr("device", device);
}

namespace {

// How deep a hyperparameter's lists may nest in hparams.yaml. export() records flat lists; a
// module file made by hand (or by an attacker) could nest without end, and emitting recurses.
constexpr int kMaxHyperParameterDepth = 32;

// Emits a hyperparameter's value as one YAML flow node: what save_hyperparameters() can record
// (bool, int, float, str and lists of them). UNIMPLEMENTED for another type, OUT_OF_RANGE for
// lists nested deeper than kMaxHyperParameterDepth.
absl::Status EmitFlow(YAML::Emitter& out, const c10::IValue& value, int depth) {
  if (value.isBool()) {
    out << value.toBool();
  } else if (value.isInt()) {
    out << static_cast<long long>(value.toInt());
  } else if (value.isDouble()) {
    // The shortest text that reads back exactly, as a float (common/yaml_float.h); the emitter
    // writes it as a plain scalar.
    out << YamlFloat(value.toDouble());
  } else if (value.isString()) {
    // Quoted, so that "32" stays a string. HyperParametersYaml's emitter escapes every byte
    // beyond ASCII: PyYAML refuses a raw DEL and takes U+2028 for a line break.
    out << YAML::DoubleQuoted << value.toStringRef();
  } else if (value.isList()) {
    if (depth >= kMaxHyperParameterDepth) {
      return absl::OutOfRangeError(
          absl::StrCat("its lists nest deeper than ", kMaxHyperParameterDepth, " levels"));
    }
    out << YAML::Flow << YAML::BeginSeq;
    for (const c10::IValue& item : value.toListRef()) {
      if (absl::Status s = EmitFlow(out, item, depth + 1); !s.ok()) return s;
    }
    out << YAML::EndSeq;
  } else {
    return absl::UnimplementedError(absl::StrCat(
        "hparams.yaml holds bool, int, float, str and lists of them, not a ", value.tagKind()));
  }
  if (!out.good()) return absl::InternalError(out.GetLastError());
  return absl::OkStatus();
}

}  // namespace

std::vector<std::pair<std::string, c10::IValue>> LightningModule::HyperParameters() const {
  std::vector<std::pair<std::string, c10::IValue>> out;
  if (!HasAttribute("hparams", c10::TypeKind::TupleType)) return out;
  const c10::IValue value = module_.attr("hparams");
  // The attribute's declared type has the names; a tuple value's own type does not.
  const c10::TypePtr declared = module_.type()->getAttribute("hparams");
  const c10::TupleType& type = declared->expectRef<c10::TupleType>();
  if (!type.schema() || !value.isTuple()) return out;  // a plain tuple: no names to give
  const std::vector<c10::IValue>& fields = value.toTupleRef().elements();
  const std::vector<c10::Argument>& arguments = type.schema()->arguments();
  for (size_t i = 0; i < fields.size() && i < arguments.size(); ++i) {
    out.emplace_back(arguments[i].name(), fields[i]);
  }
  return out;
}

LightningModule::HyperParametersText LightningModule::HyperParametersYaml() const {
  HyperParametersText out;
  for (const auto& [name, value] : HyperParameters()) {
    YAML::Emitter emitter;
    emitter.SetOutputCharset(YAML::EscapeNonAscii);
    if (absl::Status s = EmitFlow(emitter, value, 0); !s.ok()) {
      out.left_out.push_back(absl::StrCat("hyperparameter '", name, "' of model '", origin_,
                                          "' is left out of hparams.yaml: ", s.message()));
      continue;
    }
    out.yaml.emplace_back(name, emitter.c_str());
  }
  return out;
}

absl::StatusOr<c10::IValue> LightningModule::Call(const std::string& method,
                                                  std::vector<c10::IValue> args) {
  // One lookup (a TorchScript class compares its methods' names one by one), and a message
  // made only when the call fails: this runs a few times every batch.
  c10::optional<torch::jit::Method> found = module_.find_method(method);
  if (!found.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat("model '", origin_, "' does not define ", method));
  }
  return GuardTorchLazy([&] { return absl::StrCat(method, " of model '", origin_, "' failed"); },
                        [&]() -> absl::StatusOr<c10::IValue> { return (*found)(std::move(args)); });
}

absl::Status LightningModule::CallHook(const std::string& name) {
  // A hook runs a few times an epoch: a lookup of its own costs nothing, and "not defined" is
  // then not read out of Call's status codes.
  if (!HasMethod(name)) return absl::OkStatus();
  return Call(name, {}).status();
}

absl::StatusOr<c10::IValue> LightningModule::RawStep(const std::string& method,
                                                     const c10::IValue& batch, int64_t batch_idx) {
  return Call(method, {batch, batch_idx});
}

absl::StatusOr<c10::IValue> LightningModule::StepEnd(const std::string& method,
                                                     c10::IValue output) {
  // Lightning's <step>_end(step_output): its result is the step's output (predict has none).
  const std::string end = method + "_end";
  if (method == "predict_step" || !HasMethod(end)) return output;
  return Call(end, {std::move(output)});
}

absl::StatusOr<torch::Tensor> LightningModule::TrainingStep(const c10::IValue& batch,
                                                            int64_t batch_idx) {
  absl::StatusOr<c10::IValue> out = RawStep("training_step", batch, batch_idx);
  if (out.ok()) out = StepEnd("training_step", *std::move(out));
  if (!out.ok()) return out.status();
  return TrainingLoss(*out);
}

absl::StatusOr<torch::Tensor> LightningModule::TrainingLoss(const c10::IValue& out) {
  torch::Tensor loss;
  last_training_keys_.clear();
  if (out.isTensor()) {
    loss = out.toTensor();
    last_training_keys_.push_back("loss");
  } else if (out.isGenericDict() && out.toGenericDict().contains("loss") &&
             out.toGenericDict().at("loss").isTensor()) {
    for (const auto& entry : out.toGenericDict()) {
      if (entry.key().isString()) last_training_keys_.push_back(entry.key().toStringRef());
      if (!entry.key().isString() || entry.key().toStringRef() == "loss") continue;
      if (!entry.value().isTensor() || entry.value().toTensor().numel() != 1) continue;
      auto& [sum, count] = training_extras_[entry.key().toStringRef()];
      sum += ReportedScalar(entry.value().toTensor());
      ++count;
    }
    loss = out.toGenericDict().at("loss").toTensor();
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "training_step of model '", origin_,
        "' must return a loss tensor or a dict with a 'loss' tensor, got ", out.tagKind()));
  }
  if (loss.numel() != 1 || !loss.is_floating_point()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "training_step of model '", origin_, "' must return a scalar floating-point loss, got ",
        c10::toString(loss.scalar_type()), c10::str(loss.sizes())));
  }
  return loss;
}

std::map<std::string, double> LightningModule::TakeTrainingExtras() {
  std::map<std::string, double> out;
  for (const auto& [name, sum_count] : training_extras_) {
    out[name] = sum_count.first / sum_count.second;
  }
  training_extras_.clear();
  return out;
}

absl::StatusOr<StepOutput> LightningModule::Step(const std::string& method,
                                                 const c10::IValue& batch, int64_t batch_idx) {
  absl::StatusOr<c10::IValue> out = RawStep(method, batch, batch_idx);
  if (out.ok()) out = StepEnd(method, *std::move(out));
  if (!out.ok()) return out.status();
  return ToStepOutput(method, *out);
}

absl::StatusOr<StepOutput> LightningModule::ToStepOutput(const std::string& method,
                                                         const c10::IValue& out) const {
  StepOutput result;
  // Lightning's validation and test steps often return nothing and only self.log.
  if (out.isNone() && method != "predict_step") return result;
  const bool predict = method == "predict_step";
  if (out.isTensor()) {
    result["output"] = out.toTensor();
    if (predict) predict_output_type_ = "tensor";
  } else if (predict && (out.isList() || out.isTuple())) {
    const std::vector<c10::IValue> items =
        out.isList() ? out.toListRef().vec() : out.toTupleRef().elements().vec();
    for (size_t i = 0; i < items.size(); ++i) {
      if (!items[i].isTensor()) {
        return absl::InvalidArgumentError(absl::StrCat(
            method, " of model '", origin_, "' returned a ", out.isList() ? "list" : "tuple",
            " whose item ", i, " is a ", items[i].tagKind(), "; return tensors in it"));
      }
      result[std::to_string(i)] = items[i].toTensor();
    }
    predict_output_type_ = out.isList() ? "list" : "tuple";
  } else if (out.isGenericDict()) {
    if (predict) predict_output_type_ = "dict";
    for (const auto& entry : out.toGenericDict()) {
      if (!entry.key().isString() || !entry.value().isTensor()) {
        return absl::InvalidArgumentError(
            absl::StrCat(method, " of model '", origin_, "' must return a dict of str to tensor"));
      }
      result[entry.key().toStringRef()] = entry.value().toTensor();
    }
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(method, " of model '", origin_,
                     "' must return a tensor or a dict of tensors, got ", out.tagKind()));
  }
  return result;
}

absl::StatusOr<StepOutput> LightningModule::ValidationStep(const c10::IValue& batch,
                                                           int64_t batch_idx) {
  return Step("validation_step", batch, batch_idx);
}
absl::StatusOr<StepOutput> LightningModule::TestStep(const c10::IValue& batch, int64_t batch_idx) {
  return Step("test_step", batch, batch_idx);
}
absl::StatusOr<StepOutput> LightningModule::PredictStep(const c10::IValue& batch,
                                                        int64_t batch_idx) {
  return Step("predict_step", batch, batch_idx);
}

absl::StatusOr<torch::Tensor> LightningModule::Forward(const torch::Tensor& input) {
  absl::StatusOr<c10::IValue> out = Call("forward", {input});
  if (!out.ok()) return out.status();
  if (!out->isTensor()) {
    return absl::InvalidArgumentError(
        absl::StrCat("forward of model '", origin_, "' must return a tensor"));
  }
  return out->toTensor();
}

bool LightningModule::ReadsGradients() const {
  // TorchScript compiles `t.grad` to prim::grad, however the tensor was reached; every method
  // of every submodule is an entry (a hook the trainer calls), and each call is followed.
  absl::StatusOr<bool> reads =
      GuardTorch("cannot inspect the module's code", [&]() -> absl::StatusOr<bool> {
        std::unordered_set<const torch::jit::Graph*> seen;
        for (const torch::jit::Module& m : module_.modules()) {
          for (const torch::jit::Method& method : m.get_methods()) {
            if (FunctionReadsGradients(method.function(), seen)) return true;
          }
        }
        return false;
      });
  return !reads.ok() || *reads;
}

std::vector<std::pair<std::string, torch::Tensor>> LightningModule::NamedParameters() const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& p : module_.named_parameters()) out.emplace_back(p.name, p.value);
  return out;
}

void LightningModule::Train(bool on) { module_.train(on); }

absl::Status LightningModule::Save(const std::string& path) const {
  return GuardTorch(absl::StrCat("cannot save model to '", path, "'"), [&]() -> absl::Status {
    module_.save(path);
    return absl::OkStatus();
  });
}

}  // namespace dtrain
