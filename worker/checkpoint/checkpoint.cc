#include "worker/checkpoint/checkpoint.h"
#include "worker/plugins/plugin_registry.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <type_traits>
#include <unordered_set>
#include <utility>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include "absl/strings/str_cat.h"
#include "common/directories.h"
#include "common/int_of_double.h"
#include "common/log.h"
#include "common/plugin_catalog.h"
#include "common/status_macros.h"
#include "worker/model/torch_save_file.h"
#include "worker/model/torch_status.h"

namespace dtrain {
namespace {

// The CUDA generators' states (torch.cuda.get_rng_state_all), beside the CPU generator's, so
// that a resumed CUDA job draws what it would have drawn; none without CUDA. Listed from the
// current device (the rank's root: worker/model/current_device.h) on, wrapping around: rank 0
// writes the checkpoint, every ddp rank seeds and draws alike, so entry 0 is what each rank's
// root device restores, and dp's replicas (root cuda:0, replica i on cuda:i) restore entry i.
std::optional<c10::IValue> CudaGeneratorStates() {
  const at::CUDAHooksInterface& cuda = at::detail::getCUDAHooks();
  if (!cuda.hasCUDA() || cuda.getNumGPUs() <= 0) return std::nullopt;
  const int devices = cuda.getNumGPUs();
  const int64_t root = cuda.current_device();
  c10::impl::GenericList states(c10::TensorType::get());
  for (int i = 0; i < devices; ++i) {
    at::Generator generator =
        cuda.getDefaultCUDAGenerator(static_cast<c10::DeviceIndex>((root + i) % devices));
    std::lock_guard<std::mutex> lock(generator.mutex());
    states.push_back(generator.get_state());
  }
  return c10::IValue(states);
}

// Entry i onto the device i places after the current one, for as many as this worker has: a
// checkpoint written on GPUs loads on a CPU worker (it then has none to restore) and on a
// machine with fewer GPUs, saying so once. A state is copied contiguous first: set_state reads
// numel bytes from the data pointer, and a file's strides are the file's to choose.
void RestoreCudaGenerators(c10::ArrayRef<c10::IValue> states) {
  const at::CUDAHooksInterface& cuda = at::detail::getCUDAHooks();
  const size_t devices = cuda.hasCUDA() ? static_cast<size_t>(cuda.getNumGPUs()) : 0;
  const int64_t root = devices > 0 ? cuda.current_device() : 0;
  for (size_t i = 0; i < states.size() && i < devices; ++i) {
    if (!states[i].isTensor()) continue;
    at::Generator generator =
        cuda.getDefaultCUDAGenerator(static_cast<c10::DeviceIndex>((root + i) % devices));
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(states[i].toTensor().contiguous());
  }
  if (states.size() > devices) {
    static std::once_flag said;
    std::call_once(said, [&] {
      LogWarning(absl::StrCat("the checkpoint holds the random state of ", states.size(),
                              " CUDA devices and this worker has ", devices,
                              ": the others' draws will differ from the run that wrote it"));
    });
  }
}

constexpr int64_t kFormatVersion = 2;
// The Lightning checkpoint layout this follows (its migrations key on this field).
constexpr char kLightningLayout[] = "1.9.0";

using PyDict = c10::impl::GenericDict;

PyDict PyStrDict() { return PyDict(c10::StringType::get(), c10::AnyType::get()); }

// Python's torch.optim param group of `options`, with the keys torch 1.13's optimizers read.
PyDict PyParamGroup(const torch::optim::OptimizerOptions& options, int64_t first, int64_t count) {
  PyDict group = PyStrDict();
  group.insert("lr", options.get_lr());
  if (const auto* sgd = dynamic_cast<const torch::optim::SGDOptions*>(&options)) {
    group.insert("momentum", sgd->momentum());
    group.insert("dampening", sgd->dampening());
    group.insert("weight_decay", sgd->weight_decay());
    group.insert("nesterov", sgd->nesterov());
  } else if (const auto* rms = dynamic_cast<const torch::optim::RMSpropOptions*>(&options)) {
    group.insert("momentum", rms->momentum());
    group.insert("alpha", rms->alpha());
    group.insert("eps", rms->eps());
    group.insert("centered", rms->centered());
    group.insert("weight_decay", rms->weight_decay());
  } else if (const auto* ada = dynamic_cast<const torch::optim::AdagradOptions*>(&options)) {
    group.insert("lr_decay", ada->lr_decay());
    group.insert("eps", ada->eps());
    group.insert("weight_decay", ada->weight_decay());
    group.insert("initial_accumulator_value", ada->initial_accumulator_value());
  } else {
    double beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0;
    bool amsgrad = false;
    if (const auto* adam = dynamic_cast<const torch::optim::AdamOptions*>(&options)) {
      std::tie(beta1, beta2) = adam->betas();
      eps = adam->eps();
      weight_decay = adam->weight_decay();
      amsgrad = adam->amsgrad();
    } else if (const auto* adamw = dynamic_cast<const torch::optim::AdamWOptions*>(&options)) {
      std::tie(beta1, beta2) = adamw->betas();
      eps = adamw->eps();
      weight_decay = adamw->weight_decay();
      amsgrad = adamw->amsgrad();
    }
    group.insert("betas", c10::ivalue::Tuple::create({beta1, beta2}));
    group.insert("eps", eps);
    group.insert("weight_decay", weight_decay);
    group.insert("amsgrad", amsgrad);
    group.insert("capturable", false);
  }
  group.insert("maximize", false);
  group.insert("foreach", c10::IValue());
  group.insert("differentiable", false);
  c10::impl::GenericList params(c10::IntType::get());
  for (int64_t i = first; i < first + count; ++i) params.push_back(i);
  group.insert("params", params);
  return group;
}

// torch.optim's optimizer.state_dict() of a libtorch optimizer: parameters numbered in order
// across groups, per-parameter state under those numbers.
c10::IValue OptimizerStateDict(torch::optim::Optimizer& optimizer) {
  PyDict state(c10::IntType::get(), c10::AnyType::get());
  c10::impl::GenericList groups(c10::AnyType::get());
  int64_t index = 0;
  for (auto& group : optimizer.param_groups()) {
    const int64_t first = index;
    for (const torch::Tensor& p : group.params()) {
      auto it = optimizer.state().find(OptimizerStateKey(p));
      if (it != optimizer.state().end()) {
        PyDict entry = PyStrDict();
        if (auto* sgd = dynamic_cast<torch::optim::SGDParamState*>(it->second.get())) {
          entry.insert("momentum_buffer", sgd->momentum_buffer().defined()
                                              ? c10::IValue(sgd->momentum_buffer().detach())
                                              : c10::IValue());
        } else if (auto* adam = dynamic_cast<torch::optim::AdamParamState*>(it->second.get())) {
          entry.insert("step", torch::tensor(static_cast<float>(adam->step())));
          entry.insert("exp_avg", adam->exp_avg().detach());
          entry.insert("exp_avg_sq", adam->exp_avg_sq().detach());
          if (adam->max_exp_avg_sq().defined())
            entry.insert("max_exp_avg_sq", adam->max_exp_avg_sq().detach());
        } else if (auto* adamw = dynamic_cast<torch::optim::AdamWParamState*>(it->second.get())) {
          entry.insert("step", torch::tensor(static_cast<float>(adamw->step())));
          entry.insert("exp_avg", adamw->exp_avg().detach());
          entry.insert("exp_avg_sq", adamw->exp_avg_sq().detach());
          if (adamw->max_exp_avg_sq().defined())
            entry.insert("max_exp_avg_sq", adamw->max_exp_avg_sq().detach());
        } else if (auto* rms = dynamic_cast<torch::optim::RMSpropParamState*>(it->second.get())) {
          entry.insert("step", rms->step());  // an int in torch 1.13's RMSprop
          entry.insert("square_avg", rms->square_avg().detach());
          if (rms->momentum_buffer().defined())
            entry.insert("momentum_buffer", rms->momentum_buffer().detach());
          if (rms->grad_avg().defined()) entry.insert("grad_avg", rms->grad_avg().detach());
        } else if (auto* ada = dynamic_cast<torch::optim::AdagradParamState*>(it->second.get())) {
          entry.insert("step", torch::tensor(static_cast<float>(ada->step())));
          entry.insert("sum", ada->sum().detach());
        }
        state.insert(index, entry);
      } else if (dynamic_cast<torch::optim::SGDOptions*>(&group.options()) != nullptr &&
                 p.grad().defined()) {
        // torch's SGD without momentum keeps a None buffer for each parameter it stepped.
        PyDict entry = PyStrDict();
        entry.insert("momentum_buffer", c10::IValue());
        state.insert(index, entry);
      }
      ++index;
    }
    groups.push_back(PyParamGroup(group.options(), first, index - first));
  }
  PyDict out = PyStrDict();
  out.insert("state", state);
  out.insert("param_groups", groups);
  return out;
}

// A value of a Python dict read back: `key` of `dict`, or nullopt.
std::optional<c10::IValue> PyGet(const PyDict& dict, const std::string& key) {
  auto it = dict.find(c10::IValue(key));
  if (it == dict.end()) return std::nullopt;
  return it->value();
}

// 0 for what is not a number, or not one an int64 holds (a NaN, an infinity, 1e300), as for a
// string, rather than a cast's undefined behaviour.
int64_t PyInt(const c10::IValue& v) {
  if (v.isInt()) return v.toInt();
  if (v.isDouble()) return IntOfDouble(v.toDouble()).value_or(0);
  if (v.isTensor()) return IntOfDouble(v.toTensor().item<double>()).value_or(0);
  if (v.isBool()) return v.toBool();
  return 0;
}

double PyDouble(const c10::IValue& v) {
  if (v.isDouble()) return v.toDouble();
  if (v.isInt()) return static_cast<double>(v.toInt());
  if (v.isTensor()) return v.toTensor().item<double>();
  return 0;
}

// Restores torch.optim's state_dict() layout into `optimizer`, whose parameters (in group
// order) are the checkpoint's numbered ones. The spec's hyperparameters stay: only the state
// (momentum buffers, Adam's moments and step) moves.
absl::Status RestoreOptimizer(const c10::IValue& saved, const std::string& origin,
                              torch::optim::Optimizer& optimizer, ScheduledGroups* rates) {
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint '", origin, "': optimizer_states[0] ", what));
  };
  if (!saved.isGenericDict()) return bad("is not a dict");
  const PyDict dict = saved.toGenericDict();
  const std::optional<c10::IValue> state = PyGet(dict, "state");
  const std::optional<c10::IValue> groups = PyGet(dict, "param_groups");
  if (!state || !groups || !state->isGenericDict() || !groups->isList()) {
    return bad("has no 'state' and 'param_groups' (torch.optim's optimizer.state_dict())");
  }
  std::vector<int64_t> numbers;
  std::unordered_set<int64_t> numbered;
  for (const c10::IValue& g : groups->toList()) {
    if (!g.isGenericDict()) return bad("has a param group that is not a dict");
    const std::optional<c10::IValue> params = PyGet(g.toGenericDict(), "params");
    if (!params || !params->isList()) return bad("has a param group without 'params'");
    for (const c10::IValue& n : params->toList()) {
      // torch numbers the parameters with ints; anything else read as one would pick another
      // parameter's state (PyInt reads it as 0), whose shape may even fit.
      if (!n.isInt()) {
        return bad(absl::StrCat("numbers a parameter with a ", n.tagKind(),
                                ", not an int (torch.optim's optimizer.state_dict() writes ints)"));
      }
      if (!numbered.insert(n.toInt()).second) {
        return bad(absl::StrCat("names parameter ", n.toInt(),
                                " twice in its param_groups; each parameter has one number"));
      }
      numbers.push_back(n.toInt());
    }
    ScheduledGroup group;
    if (auto lr = PyGet(g.toGenericDict(), "lr")) group.lr = PyDouble(*lr);
    if (auto m = PyGet(g.toGenericDict(), "momentum")) group.momentum = PyDouble(*m);
    if (auto betas = PyGet(g.toGenericDict(), "betas");
        betas && betas->isTuple() && !betas->toTupleRef().elements().empty()) {
      group.momentum = PyDouble(betas->toTupleRef().elements()[0]);
    }
    rates->push_back(group);
  }
  std::vector<torch::Tensor> parameters;
  for (auto& group : optimizer.param_groups()) {
    for (const torch::Tensor& p : group.params()) parameters.push_back(p);
  }
  if (numbers.size() != parameters.size()) {
    return bad(absl::StrCat("covers ", numbers.size(), " parameters; the model's optimizer has ",
                            parameters.size()));
  }
  const PyDict states = state->toGenericDict();
  // Built aside and swapped in whole: a bad entry leaves the optimizer's state as it was.
  std::remove_reference_t<decltype(optimizer.state())> restored;
  for (size_t i = 0; i < parameters.size(); ++i) {
    const torch::Tensor& p = parameters[i];
    auto it = states.find(c10::IValue(numbers[i]));
    if (it == states.end()) continue;  // no step yet for this parameter
    if (!it->value().isGenericDict())
      return bad(absl::StrCat("state ", numbers[i], " is not a dict"));
    const PyDict s = it->value().toGenericDict();
    auto tensor = [&](const char* key, bool required) -> absl::StatusOr<torch::Tensor> {
      const std::optional<c10::IValue> v = PyGet(s, key);
      if (!v || v->isNone()) {
        if (required) return bad(absl::StrCat("state ", numbers[i], " has no '", key, "'"));
        return torch::Tensor();
      }
      if (!v->isTensor())
        return bad(absl::StrCat("state ", numbers[i], " '", key, "' is not a tensor"));
      torch::Tensor t = v->toTensor().to(p.options());
      if (t.sizes() != p.sizes()) {
        return bad(absl::StrCat("state ", numbers[i], " '", key, "' has shape ",
                                c10::str(t.sizes()), " but its parameter has ",
                                c10::str(p.sizes())));
      }
      return t;
    };
    if (dynamic_cast<torch::optim::SGD*>(&optimizer) != nullptr) {
      DTRAIN_ASSIGN_OR_RETURN(torch::Tensor buffer, tensor("momentum_buffer", false));
      // torch writes None before a parameter's buffer exists (momentum 0, or saved before the
      // first step) and its next step starts the buffer from the gradient; libtorch does so only
      // for a parameter without state, and fails on a state holding no buffer.
      if (!buffer.defined()) continue;
      auto param_state = std::make_unique<torch::optim::SGDParamState>();
      param_state->momentum_buffer(buffer);
      restored[OptimizerStateKey(p)] = std::move(param_state);
      continue;
    }
    const std::optional<c10::IValue> step = PyGet(s, "step");
    if (!step) return bad(absl::StrCat("state ", numbers[i], " has no 'step'"));
    if (dynamic_cast<torch::optim::RMSprop*>(&optimizer) != nullptr) {
      DTRAIN_ASSIGN_OR_RETURN(torch::Tensor square_avg, tensor("square_avg", true));
      DTRAIN_ASSIGN_OR_RETURN(torch::Tensor momentum_buffer, tensor("momentum_buffer", false));
      DTRAIN_ASSIGN_OR_RETURN(torch::Tensor grad_avg, tensor("grad_avg", false));
      auto param_state = std::make_unique<torch::optim::RMSpropParamState>();
      param_state->step(PyInt(*step)).square_avg(square_avg);
      if (momentum_buffer.defined()) param_state->momentum_buffer(momentum_buffer);
      if (grad_avg.defined()) param_state->grad_avg(grad_avg);
      restored[OptimizerStateKey(p)] = std::move(param_state);
      continue;
    }
    if (dynamic_cast<torch::optim::Adagrad*>(&optimizer) != nullptr) {
      DTRAIN_ASSIGN_OR_RETURN(torch::Tensor sum, tensor("sum", true));
      auto param_state = std::make_unique<torch::optim::AdagradParamState>();
      param_state->step(PyInt(*step)).sum(sum);
      restored[OptimizerStateKey(p)] = std::move(param_state);
      continue;
    }
    DTRAIN_ASSIGN_OR_RETURN(torch::Tensor exp_avg, tensor("exp_avg", true));
    DTRAIN_ASSIGN_OR_RETURN(torch::Tensor exp_avg_sq, tensor("exp_avg_sq", true));
    DTRAIN_ASSIGN_OR_RETURN(torch::Tensor max_exp_avg_sq, tensor("max_exp_avg_sq", false));
    if (dynamic_cast<torch::optim::AdamW*>(&optimizer) != nullptr) {
      auto param_state = std::make_unique<torch::optim::AdamWParamState>();
      param_state->step(PyInt(*step)).exp_avg(exp_avg).exp_avg_sq(exp_avg_sq);
      if (max_exp_avg_sq.defined()) param_state->max_exp_avg_sq(max_exp_avg_sq);
      restored[OptimizerStateKey(p)] = std::move(param_state);
    } else {
      auto param_state = std::make_unique<torch::optim::AdamParamState>();
      param_state->step(PyInt(*step)).exp_avg(exp_avg).exp_avg_sq(exp_avg_sq);
      if (max_exp_avg_sq.defined()) param_state->max_exp_avg_sq(max_exp_avg_sq);
      restored[OptimizerStateKey(p)] = std::move(param_state);
    }
  }
  optimizer.state() = std::move(restored);
  return absl::OkStatus();
}

// A checkpoint in Lightning's layout, parsed.
absl::StatusOr<TrainingProgress> RestoreLightning(const c10::IValue& file, const std::string& path,
                                                  LightningModule& model,
                                                  torch::optim::Optimizer* optimizer,
                                                  LossScaler* scaler) {
  const PyDict top = file.toGenericDict();
  const std::optional<c10::IValue> state_dict = PyGet(top, "state_dict");
  if (!state_dict || !state_dict->isGenericDict()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", path, "' is not a checkpoint: torch.load gives a dict without 'state_dict'"));
  }
  const PyDict saved = state_dict->toGenericDict();
  torch::NoGradGuard no_grad;
  torch::jit::Module& module = model.module();
  std::set<std::string> expected;
  // Copied only once the whole file has been checked, optimizer state included: a bad file
  // leaves the model as it was.
  std::vector<std::pair<torch::Tensor, torch::Tensor>> copies;
  auto restore = [&](const std::string& name, torch::Tensor target, bool buffer) -> absl::Status {
    expected.insert(name);
    const std::optional<c10::IValue> value = PyGet(saved, name);
    if (!value || !value->isTensor()) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint '", path, "' has no ", buffer ? "buffer" : "parameter", " '",
                       name, "' of model '", model.origin(), "' in its state_dict"));
    }
    const torch::Tensor t = value->toTensor();
    if (t.sizes() != target.sizes()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint '", path, "' holds '", name, "' with shape ", c10::str(t.sizes()),
          " but model '", model.origin(), "' has ", c10::str(target.sizes())));
    }
    copies.emplace_back(std::move(target), t);
    return absl::OkStatus();
  };
  for (const auto& p : module.named_parameters()) {
    DTRAIN_RETURN_IF_ERROR(restore(p.name, p.value, false));
  }
  for (const auto& b : module.named_buffers()) {
    DTRAIN_RETURN_IF_ERROR(restore(b.name, b.value, true));
  }
  for (const auto& entry : saved) {
    const std::string name = entry.key().isString() ? entry.key().toStringRef() : "?";
    if (expected.count(name) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint '", path, "' has '", name, "' in its state_dict, which model '",
                       model.origin(), "' does not have (a checkpoint of another model?)"));
    }
  }
  TrainingProgress progress;
  if (optimizer != nullptr) {
    const std::optional<c10::IValue> states = PyGet(top, "optimizer_states");
    if (states && states->isList() && states->toList().size() > 0) {
      if (states->toList().size() > 1) {
        return absl::InvalidArgumentError(absl::StrCat("checkpoint '", path, "' holds ",
                                                       states->toList().size(),
                                                       " optimizers; dtrain trains with one"));
      }
      DTRAIN_RETURN_IF_ERROR(
          RestoreOptimizer(states->toList().get(0), path, *optimizer, &progress.group_rates));
      progress.optimizer_restored = true;
    }
  }
  for (auto& [target, value] : copies) target.copy_(value);
  if (auto v = PyGet(top, "callbacks"); v && v->isGenericDict()) {
    for (const auto& entry : v->toGenericDict()) {
      if (!entry.key().isString() || !entry.value().isGenericDict()) continue;
      CallbackStateDict cb;
      cb.key = entry.key().toStringRef();
      for (const auto& item : entry.value().toGenericDict()) {
        if (!item.key().isString()) continue;
        const std::string& name = item.key().toStringRef();
        const c10::IValue& value = item.value();
        if (value.isInt()) {
          cb.ints[name] = value.toInt();
        } else if (value.isDouble()) {
          cb.floats[name] = value.toDouble();
        } else if (value.isTensor() && value.toTensor().numel() == 1) {
          cb.tensors[name] = value.toTensor().item<double>();
        }
      }
      progress.callbacks.push_back(std::move(cb));
    }
  }
  if (auto v = PyGet(top, "lr_schedulers"); v && v->isList()) {
    for (const c10::IValue& s : v->toListRef()) progress.lr_schedulers.push_back(s);
  }
  if (auto v = PyGet(top, "global_step")) progress.global_step = PyInt(*v);
  if (auto v = PyGet(top, "epoch")) progress.epoch = PyInt(*v);
  if (auto v = PyGet(top, "native_amp_scaling_state");
      v && scaler != nullptr && v->isGenericDict()) {
    const PyDict amp = v->toGenericDict();
    const std::optional<c10::IValue> scale = PyGet(amp, "scale");
    const std::optional<c10::IValue> tracker = PyGet(amp, "_growth_tracker");
    if (scale) scaler->Restore(PyDouble(*scale), tracker ? PyInt(*tracker) : 0);
  }
  if (auto meta = PyGet(top, "dtrain"); meta && meta->isGenericDict()) {
    if (auto rng = PyGet(meta->toGenericDict(), "rng_cpu"); rng && rng->isTensor()) {
      at::Generator generator = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(generator.mutex());
      generator.set_state(rng->toTensor().contiguous());  // set_state ignores strides
    }
    if (auto rng = PyGet(meta->toGenericDict(), "rng_cuda"); rng && rng->isList()) {
      RestoreCudaGenerators(rng->toListRef());
    }
  }
  return progress;
}

}  // namespace

absl::Status PrepareCheckpointDirectory(const std::string& dir) {
  DTRAIN_RETURN_IF_ERROR(MakeDirectories(dir, "the checkpoint directory"));
  std::error_code error;
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
                            const TrainingProgress& progress, const CheckpointMetadata& metadata,
                            CheckpointIO* io, const StorageOptions& storage_options) {
  absl::StatusOr<c10::IValue> file = GuardTorch(
      absl::StrCat("cannot write checkpoint '", path, "'"), [&]() -> absl::StatusOr<c10::IValue> {
        PyDict top = PyStrDict();
        PyDict state_dict(c10::StringType::get(), c10::TensorType::get());
        torch::jit::Module& module = const_cast<LightningModule&>(model).module();
        for (const auto& p : module.named_parameters()) {
          // A parameter that lives in a larger buffer (ddp's split step keeps them beside their
          // gradient bucket) is written on its own, so that the file holds one storage per
          // tensor as Lightning's does (safetensors refuses tensors that share memory).
          const bool own =
              p.value.storage_offset() == 0 && p.value.storage().nbytes() == p.value.nbytes();
          state_dict.insert(p.name, own ? p.value.detach() : p.value.detach().clone());
        }
        for (const auto& b : module.named_buffers()) {
          state_dict.insert(b.name, b.value.detach());
        }
        top.insert("state_dict", state_dict);
        // As Lightning's: the class is rebuilt with cls(**ckpt["hyper_parameters"]).
        const std::vector<std::pair<std::string, c10::IValue>> hparams = model.HyperParameters();
        if (!hparams.empty()) {
          PyDict recorded = PyStrDict();
          for (const auto& [name, value] : hparams) recorded.insert(name, value);
          top.insert("hyper_parameters", recorded);
          top.insert("hparams_name", std::string("kwargs"));
        }
        c10::impl::GenericList schedulers(c10::AnyType::get());
        if (metadata.schedulers != nullptr) {
          for (const c10::IValue& s : metadata.schedulers->StateDicts()) schedulers.push_back(s);
        } else if (metadata.schedule != nullptr) {
          c10::IValue state = metadata.schedule->StateDict(progress.global_step);
          if (!state.isNone()) schedulers.push_back(state);
        }
        c10::impl::GenericList optimizers(c10::AnyType::get());
        if (optimizer != nullptr) {
          c10::IValue state = OptimizerStateDict(*optimizer);
          // (A cosine whose length this worker never learnt, in a run resumed at its very end
          // that trained no step, has no next rate: the groups keep the spec's.)
          if (metadata.schedulers != nullptr) {
            // The keys torch's schedulers add to each param group.
            const ScheduledGroups& rates = metadata.schedulers->groups();
            const c10::List<c10::IValue> groups = state.toGenericDict().at("param_groups").toList();
            for (size_t i = 0; i < groups.size() && i < rates.size(); ++i) {
              PyDict g = groups.get(i).toGenericDict();
              if (rates[i].initial_lr) g.insert_or_assign("initial_lr", *rates[i].initial_lr);
              if (rates[i].one_cycle) {
                g.insert_or_assign("max_lr", rates[i].max_lr);
                g.insert_or_assign("min_lr", rates[i].min_lr);
                g.insert_or_assign("base_momentum", rates[i].base_momentum);
                g.insert_or_assign("max_momentum", rates[i].max_momentum);
              }
            }
          } else if (!schedulers.empty() && !metadata.schedule->NeedsRunLength()) {
            // As torch's scheduler.step() leaves them after each optimizer step: the rate of the
            // next step (the group holds the last step's), and the schedule's base rate beside
            // it; torch's schedulers compute the next rate from the group's.
            for (const c10::IValue& group : state.toGenericDict().at("param_groups").toList()) {
              PyDict g = group.toGenericDict();
              g.insert_or_assign("lr", metadata.schedule->LrAt(progress.global_step));
              g.insert_or_assign("initial_lr", metadata.schedule->LrAt(0));
            }
          }
          optimizers.push_back(state);
        }
        top.insert("optimizer_states", optimizers);
        PyDict callbacks = PyStrDict();
        for (const CallbackStateDict& cb : metadata.callbacks) {
          PyDict state = PyStrDict();
          for (const auto& [name, v] : cb.ints) state.insert(name, v);
          for (const auto& [name, v] : cb.floats) state.insert(name, v);
          for (const auto& [name, v] : cb.tensors) {
            state.insert(name, torch::tensor(static_cast<float>(v)));
          }
          callbacks.insert(cb.key, state);
        }
        top.insert("callbacks", callbacks);
        top.insert("lr_schedulers", schedulers);
        top.insert("epoch", progress.epoch);
        top.insert("global_step", progress.global_step);
        if (scaler != nullptr) {
          PyDict amp = PyStrDict();
          amp.insert("scale", scaler->scale());
          amp.insert("growth_factor", scaler->options().growth_factor);
          amp.insert("backoff_factor", scaler->options().backoff_factor);
          amp.insert("growth_interval", scaler->options().growth_interval);
          amp.insert("_growth_tracker", scaler->growth_tracker());
          top.insert("native_amp_scaling_state", amp);
        }
        top.insert("pytorch-lightning_version", std::string(kLightningLayout));
        PyDict meta = PyStrDict();
        meta.insert("format_version", kFormatVersion);
        meta.insert("world_size", static_cast<int64_t>(metadata.world_size));
        meta.insert("strategy", metadata.strategy);
        meta.insert("precision", metadata.precision);
        meta.insert("job_spec", metadata.job_spec_json);
        {
          at::Generator generator = at::detail::getDefaultCPUGenerator();
          std::lock_guard<std::mutex> lock(generator.mutex());
          meta.insert("rng_cpu", generator.get_state());
        }
        if (std::optional<c10::IValue> cuda = CudaGeneratorStates()) meta.insert("rng_cuda", *cuda);
        top.insert("dtrain", meta);
        return c10::IValue(top);
      });
  if (!file.ok()) return file.status();
  TorchCheckpointIO torch_io;
  return (io != nullptr ? *io : torch_io).Save(*file, path, storage_options);
}

absl::Status TorchCheckpointIO::Save(const c10::IValue& checkpoint, const std::string& path,
                                     const StorageOptions&) {
  return WriteTorchSaveFile(path, checkpoint);
}

absl::StatusOr<std::string> TorchCheckpointIO::Load(const std::string& path) {
  return ReadCheckpointFile(path);
}

void RegisterBuiltinCheckpointIO(PluginRegistry& registry) {
  // The catalog's one (common/plugin_catalog.h).
  const PluginCatalogEntry* torch_io = FindInCatalog("checkpoint_io", "torch");
  absl::Status s = registry.AddCheckpointIO(
      torch_io->name,
      []() -> absl::StatusOr<std::unique_ptr<CheckpointIO>> {
        return std::make_unique<TorchCheckpointIO>();
      },
      torch_io->description);
  if (!s.ok()) LogError(absl::StrCat("cannot register checkpoint_io torch: ", s.ToString()));
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
  absl::StatusOr<c10::IValue> file = ParseTorchSave(bytes, path);
  if (file.ok() && file->isGenericDict()) {
    absl::StatusOr<TrainingProgress> progress =
        GuardTorch(absl::StrCat("cannot load checkpoint '", path, "'"),
                   [&]() { return RestoreLightning(*file, path, model, optimizer, scaler); });
    return progress;
  }
  // dtrain's format 1 (a libtorch archive) is no longer read: it is TorchScript, and loading
  // one runs its code (docs/decisions/checkpoints-and-artifacts.md).
  return absl::InvalidArgumentError(absl::StrCat(
      "'", path,
      "' is not a checkpoint: torch.load should give a dict with 'state_dict' (Lightning's "
      "layout)",
      file.ok() ? absl::StrCat(", it gives a ", file->tagKind())
                : absl::StrCat(" (", file.status().message(), ")")));
}

}  // namespace dtrain
