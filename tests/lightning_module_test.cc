// Users' TorchScript LightningModules as the worker wraps them: loading (and refusing bad files
// clearly), save_hyperparameters() values as hparams.yaml text, step and hook calls with
// Lightning's loop state, and the scan of the module's code for .grad reads.

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/script.h>
#include <yaml-cpp/yaml.h>

#include "absl/strings/str_cat.h"
#include "tests/test_support.h"
#include "tests/worker_test_helpers.h"
#include "worker/model/lightning_module.h"
#include "worker/model/model_zoo.h"
#include "worker/model/script_execution.h"

namespace dtrain {
namespace lightning_module_test {

using ::testing::HasSubstr;

std::string TempPath(const std::string& name) { return testing::TestTempPath(name); }

TEST(LightningModuleFile, SavedAndLoaded_SameOutputs) {
  auto model = BuiltinModel("cnn", 5);
  ASSERT_TRUE(model.ok());
  const std::string path = TempPath("cnn.pt");
  ASSERT_TRUE(model->Save(path).ok());
  auto loaded = LightningModule::Load(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const torch::Tensor x = torch::randn({4, 1, 28, 28});
  EXPECT_TRUE(torch::equal(*model->Forward(x), *loaded->Forward(x)));
  EXPECT_TRUE(loaded->HasMethod("validation_step"));
}

TEST(LightningModuleFile, MissingFile_NotFound) {
  auto loaded = LightningModule::Load(TempPath("no-such-model.pt"));
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(loaded.status().message()), HasSubstr("no-such-model.pt"));
}

TEST(LightningModuleFile, NotTorchScript_InvalidArgumentWithHint) {
  const std::string path = TempPath("garbage.pt");
  FILE* f = std::fopen(path.c_str(), "w");
  std::fputs("not a model", f);
  std::fclose(f);
  auto loaded = LightningModule::Load(path);
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(loaded.status().message()), HasSubstr("torch.jit.save"));
}

TEST(LightningModuleFile, NoTrainingStep_InvalidArgument) {
  torch::jit::Module m("Plain");
  m.define("def forward(self, x: Tensor) -> Tensor:\n    return x * 2\n");
  const std::string path = TempPath("plain.pt");
  m.save(path);
  auto loaded = LightningModule::Load(path);
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(loaded.status().message()), HasSubstr("no training_step"));
}

// hparams.yaml's values come from the module, whose file may be made by hand: each value is one
// YAML flow node that reads back as what was recorded; a list nested past 32 levels, and a type
// save_hyperparameters() does not record, are left out with a message naming the hyperparameter.
TEST(LightningModuleHyperParameters, EachValueReadsBackAsRecorded_DeepListsLeftOutByName) {
  // Lists of ints nested `levels` deep: [[...[7]...]].
  auto nested = [](int levels) {
    c10::TypePtr type = c10::ListType::create(c10::IntType::get());
    c10::IValue value = c10::List<int64_t>({7});
    for (int i = 1; i < levels; ++i) {
      c10::impl::GenericList outer(type);
      outer.push_back(value);
      value = outer;
      type = c10::ListType::create(type);
    }
    return std::make_pair(type, value);
  };
  const auto [ok_type, ok_value] = nested(32);
  const auto [deep_type, deep_value] = nested(33);
  const std::string text = "say \"hi\"\\ \n\t\x01 caf\xc3\xa9 \x7f \xe2\x80\xa8 \xff";
  const std::vector<std::string> names = {"lr",   "hidden", "tiny",   "name",   "sizes",
                                          "flag", "nan",    "nested", "deeper", "weights"};
  const std::vector<c10::TypePtr> types = {c10::FloatType::get(),
                                           c10::FloatType::get(),
                                           c10::FloatType::get(),
                                           c10::StringType::get(),
                                           c10::ListType::create(c10::IntType::get()),
                                           c10::BoolType::get(),
                                           c10::FloatType::get(),
                                           ok_type,
                                           deep_type,
                                           c10::TensorType::get()};
  const c10::TupleTypePtr hparams_type =
      c10::TupleType::createNamed(c10::QualifiedName("HParamsTest"), names, types);
  const std::vector<c10::IValue> values = {
      0.05, 32.0,         -1e-05,   text,       c10::List<int64_t>({32, 10}),
      true, std::nan(""), ok_value, deep_value, torch::ones({2})};
  torch::jit::Module m("WithHparams");
  m.register_parameter("w", torch::ones({1}), false);
  m.register_attribute("hparams", hparams_type,
                       c10::ivalue::Tuple::createNamed(values, hparams_type));
  m.define(R"(
def training_step(self, batch: Tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
    return (self.w * batch[0]).sum()
)");
  auto model = LightningModule::Wrap(m, "with-hparams");
  ASSERT_TRUE(model.ok()) << model.status();

  const LightningModule::HyperParametersText out = model->HyperParametersYaml();
  std::map<std::string, std::string> yaml(out.yaml.begin(), out.yaml.end());
  ASSERT_EQ(out.yaml.size(), 8u);
  EXPECT_EQ(out.yaml[0].first, "lr");  // in the recorded order
  EXPECT_EQ(yaml["lr"], "0.05");       // the shortest text that reads back exactly
  EXPECT_EQ(yaml["hidden"], "32.0");   // a float stays a float
  // With a dot, so that YAML 1.1 (PyYAML) reads a float, not the string "-1e-05".
  EXPECT_EQ(yaml["tiny"], "-1.0e-05");
  EXPECT_EQ(yaml["sizes"], "[32, 10]");
  EXPECT_EQ(yaml["flag"], "true");
  EXPECT_EQ(yaml["nan"], ".nan");
  for (const auto& [name, flow] : out.yaml) {
    // One line of printable ASCII each: PyYAML refuses a raw DEL and breaks lines at U+2028.
    for (const char c : flow) {
      EXPECT_TRUE(static_cast<unsigned char>(c) >= 0x20 && static_cast<unsigned char>(c) < 0x7f)
          << name << ": " << flow;
    }
  }
  EXPECT_EQ(YAML::Load(yaml["lr"]).as<double>(), 0.05);
  // The string reads back byte for byte, but for the byte that is not UTF-8 (U+FFFD for it).
  EXPECT_EQ(YAML::Load(yaml["name"]).as<std::string>(),
            std::string("say \"hi\"\\ \n\t\x01 caf\xc3\xa9 \x7f \xe2\x80\xa8 \xef\xbf\xbd"));
  YAML::Node node = YAML::Load(yaml["nested"]);
  for (int level = 1; level < 32; ++level) {
    ASSERT_TRUE(node.IsSequence()) << level;
    ASSERT_EQ(node.size(), 1u);
    node = node[0];
  }
  EXPECT_EQ(node[0].as<int>(), 7);

  ASSERT_EQ(out.left_out.size(), 2u);
  EXPECT_THAT(out.left_out[0], HasSubstr("hyperparameter 'deeper'"));
  EXPECT_THAT(out.left_out[0], HasSubstr("nest deeper than 32 levels"));
  EXPECT_THAT(out.left_out[1], HasSubstr("hyperparameter 'weights'"));
  EXPECT_THAT(out.left_out[1], HasSubstr("Tensor"));
}

TEST(LightningModuleCalls, WrongBatchShape_InvalidArgumentWithLibtorchMessage) {
  auto model = BuiltinModel("mlp", 1);
  ASSERT_TRUE(model.ok());
  const c10::IValue bad =
      c10::ivalue::Tuple::create({torch::randn({4, 100}), torch::zeros({4}, torch::kInt64)});
  auto loss = model->TrainingStep(bad, 0);
  EXPECT_EQ(loss.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(loss.status().message()),
              HasSubstr("training_step of model 'builtin:mlp' failed"));
  EXPECT_THAT(std::string(loss.status().message()), HasSubstr("shapes cannot be multiplied"));
  // The module is still usable afterwards.
  const auto [x, y] = SyntheticBatch(4, 1);
  EXPECT_TRUE(model->TrainingStep(c10::ivalue::Tuple::create({x, y}), 1).ok());
}

TEST(LightningModuleCalls, MissingOptionalStep_FailedPrecondition) {
  torch::jit::Module m("OnlyTrain");
  m.register_parameter("w", torch::ones({1}), false);
  m.define(R"(
def training_step(self, batch: Tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
    return (self.w * batch[0]).sum()
)");
  auto model = LightningModule::Wrap(m, "only-train");
  ASSERT_TRUE(model.ok());
  auto out = model->TestStep(c10::ivalue::Tuple::create({torch::ones({2}), torch::ones({2})}), 0);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(out.status().message()), HasSubstr("does not define test_step"));
}

// Lightning's self.current_epoch / self.global_step reach the module's code through its own int
// attributes (found once, written by slot each step); a hook is called when the module defines
// it, skipped when it does not, and a hook that raises fails with its message and its name.
TEST(LightningModuleCalls, LoopStateAndHooks_ThroughTheModulesOwnAttributesAndMethods) {
  torch::jit::Module m("Looped");
  m.register_parameter("w", torch::ones({1}), false);
  m.register_attribute("current_epoch", c10::IntType::get(), int64_t{0});
  m.register_attribute("global_step", c10::IntType::get(), int64_t{0});
  m.register_attribute("started", c10::IntType::get(), int64_t{0});
  m.define(R"(
def training_step(self, batch: Tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
    return (self.w * batch[0]).sum() + self.current_epoch * 100 + self.global_step
def on_train_epoch_start(self):
    self.started = self.started + 1
def on_fit_end(self):
    assert self.started > 5, "too few epochs"
)");
  auto model = LightningModule::Wrap(m, "looped");
  ASSERT_TRUE(model.ok()) << model.status();
  const c10::IValue batch = c10::ivalue::Tuple::create({torch::ones({2}), torch::ones({2})});
  model->SetLoopState(3, 7);
  absl::StatusOr<torch::Tensor> loss = model->TrainingStep(batch, 0);
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_EQ(loss->item<float>(), 2 + 300 + 7);
  model->SetLoopState(4, 9);
  EXPECT_EQ(model->TrainingStep(batch, 1)->item<float>(), 2 + 400 + 9);
  EXPECT_TRUE(model->CallHook("on_train_epoch_start").ok());
  EXPECT_TRUE(model->CallHook("on_train_epoch_start").ok());
  EXPECT_EQ(model->module().attr("started").toInt(), 2);
  EXPECT_TRUE(model->CallHook("on_validation_epoch_end").ok()) << "not defined: nothing to call";
  const absl::Status failed = model->CallHook("on_fit_end");
  EXPECT_EQ(failed.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(failed.message()), HasSubstr("on_fit_end of model 'looped' failed"));
  EXPECT_THAT(std::string(failed.message()), HasSubstr("too few epochs"));

  // Attributes of those names but not ints are the module's own business: left as they are.
  torch::jit::Module other("Floats");
  other.register_parameter("w", torch::ones({1}), false);
  other.register_attribute("current_epoch", c10::FloatType::get(), 0.5);
  other.define(R"(
def training_step(self, batch: Tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
    return (self.w * batch[0]).sum() + self.current_epoch
)");
  auto floats = LightningModule::Wrap(other, "floats");
  ASSERT_TRUE(floats.ok()) << floats.status();
  floats->SetLoopState(3, 7);
  EXPECT_EQ(floats->module().attr("current_epoch").toDouble(), 0.5);
  EXPECT_EQ(floats->TrainingStep(batch, 0)->item<float>(), 2.5f);
}

// ReadsGradients sees a .grad read wherever the module's code makes it: in a method that
// training_step calls, in a hook, in a submodule's method, in a scripted function; a call through
// an interface counts as one; the zoo's models read none.
TEST(LightningModuleCode, ReadsGradients_WhereverTheCodeReadsGrad) {
  for (const std::string name : {"mlp", "cnn"}) {
    auto model = BuiltinModel(name, 1);
    ASSERT_TRUE(model.ok()) << model.status();
    EXPECT_FALSE(model->ReadsGradients()) << name;
    // As a job's CPU thread scans it: with the executor's optimization off, a method's optimized
    // graph keeps its calls (training_step's self.forward), which the scan follows itself.
    const ScriptExecutionScope scope(torch::Device(torch::kCPU));
    EXPECT_FALSE(model->ReadsGradients()) << name << ", the executor's optimization off";
  }
  auto wrap = [](const std::string& source, bool child_reads) {
    torch::jit::Module m("Reader");
    m.register_parameter("w", torch::ones({1}), false);
    torch::jit::Module child("Child");
    child.register_parameter("v", torch::ones({1}), false);
    child.define(child_reads ? R"(
def norm(self) -> float:
    g = self.v.grad
    return 0.0 if g is None else float(g.sum())
)"
                             : R"(
def norm(self) -> float:
    return float(self.v.sum())
)");
    m.register_module("child", child);
    m.define(source);
    auto model = LightningModule::Wrap(m, "reader");
    EXPECT_TRUE(model.ok()) << model.status();
    return model.ok() && model->ReadsGradients();
  };
  const std::string plain = R"(
def training_step(self, batch: Tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
    return (self.w * batch[0]).sum() + self.child.norm()
)";
  EXPECT_FALSE(wrap(plain, false));
  EXPECT_TRUE(wrap(plain, true)) << "a submodule's method reads .grad";
  EXPECT_TRUE(wrap(R"(
def penalty(self) -> Tensor:
    g = self.w.grad
    if g is None:
        return torch.zeros(1)
    return g * 0.5

def training_step(self, batch: Tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
    return (self.w * batch[0]).sum() + self.penalty().sum()
)",
                   false))
      << "a method training_step calls reads .grad";
  EXPECT_TRUE(wrap(plain + R"(
def on_train_epoch_end(self):
    if self.w.grad is not None:
        print(self.w.grad)
)",
                   false))
      << "a hook reads .grad";

  // As Python exports them: a scripted free function (prim::CallFunction, inlined) that reads
  // .grad; and a call through an interface-typed attribute, which no inlining follows, so it
  // counts as a read though the module behind it reads nothing.
  const std::string dir = TempPath("reads-grad-python");
  std::filesystem::create_directories(dir);
  const testing::CommandResult exported = testing::RunTorchPython(absl::StrCat(R"(
from typing import Tuple
def penalty(t: torch.Tensor) -> torch.Tensor:
    g = t.grad
    return torch.zeros(1) if g is None else g.sum().reshape([1])
def plain(t: torch.Tensor) -> torch.Tensor:
    return t.sum().reshape([1])
@torch.jit.interface
class Norm(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pass
class Sum(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum()
class FunctionReads(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(1))
    @torch.jit.export
    def training_step(self, batch: Tuple[torch.Tensor, torch.Tensor], batch_idx: int):
        return (self.w * batch[0]).sum() + penalty(self.w).sum()
class FunctionPlain(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(1))
    @torch.jit.export
    def training_step(self, batch: Tuple[torch.Tensor, torch.Tensor], batch_idx: int):
        return (self.w * batch[0]).sum() + plain(self.w).sum()
class Interface(torch.nn.Module):
    norm: Norm
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(1))
        self.norm = Sum()
    @torch.jit.export
    def training_step(self, batch: Tuple[torch.Tensor, torch.Tensor], batch_idx: int):
        return self.norm.forward(self.w * batch[0])
d = ")",
                                                                               dir, R"("
torch.jit.save(torch.jit.script(FunctionReads()), d + "/function-reads.pt")
torch.jit.save(torch.jit.script(FunctionPlain()), d + "/function-plain.pt")
torch.jit.save(torch.jit.script(Interface()), d + "/interface.pt")
)"));
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  auto reads = [&](const std::string& name) {
    auto model = LightningModule::Load(absl::StrCat(dir, "/", name, ".pt"));
    EXPECT_TRUE(model.ok()) << model.status();
    return model.ok() && model->ReadsGradients();
  };
  EXPECT_TRUE(reads("function-reads")) << "a scripted function training_step calls reads .grad";
  EXPECT_FALSE(reads("function-plain"));
  EXPECT_TRUE(reads("interface")) << "a call through an interface is not followed";
}

}  // namespace lightning_module_test
}  // namespace dtrain
