// torch.save files Python wrote, read by the worker as data and checkpoints
// (worker/model/torch_save_file, worker/data): every split shape, normalization, clear errors,
// the pickle rewrite, Python objects libtorch cannot hold, and the gate before libtorch's
// unpickler (worker/model/pickle_check) against hostile pickles, storages and tensor views; and
// what dtrain writes, loaded by torch.load with weights_only=True.
#include <malloc.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <new>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/optim/optimizer.h>
#include <torch/script.h>
#include <torch/utils.h>

#include "absl/strings/str_cat.h"
#include "tests/test_support.h"
#include "worker/data/dataset.h"
#include "worker/model/pickle_check.h"
#include "worker/model/torch_save_file.h"

// Heap bytes allocated while a measurement runs on this thread, and their peak: the pickle
// rewrite's memory is measured, not estimated (issue 38). A replaced operator new is the whole
// executable's, so this file is a test executable of its own (tests/CMakeLists.txt).
namespace {
thread_local bool tl_counting = false;
thread_local int64_t tl_live = 0;
thread_local int64_t tl_peak = 0;
}  // namespace

void* operator new(size_t size) {
  void* p = std::malloc(size == 0 ? 1 : size);
  if (p == nullptr) throw std::bad_alloc();
  if (tl_counting) {
    tl_live += static_cast<int64_t>(malloc_usable_size(p));
    tl_peak = std::max(tl_peak, tl_live);
  }
  return p;
}
void operator delete(void* p) noexcept {
  if (p != nullptr && tl_counting) tl_live -= static_cast<int64_t>(malloc_usable_size(p));
  std::free(p);
}
void operator delete(void* p, size_t) noexcept { operator delete(p); }

namespace dtrain {
namespace torch_save_file_test {

using ::testing::HasSubstr;

// The peak of heap bytes `fn` holds at once beyond what it started with.
int64_t PeakHeapBytes(const std::function<void()>& fn) {
  tl_live = 0;
  tl_peak = 0;
  tl_counting = true;
  fn();
  tl_counting = false;
  return tl_peak;
}

// Runs `script` with Debian's python3 and its torch (python3-torch).
void Python(const std::string& script) {
  testing::CommandResult run = testing::RunTorchPython(script);
  ASSERT_EQ(run.exit_code, 0) << run.output;
}

absl::StatusOr<std::unique_ptr<Dataset>> LoadFile(const std::string& path,
                                                  const v1::Normalize* normalize = nullptr) {
  v1::DataConfig spec;
  spec.set_tensors_file(path);
  if (normalize != nullptr) *spec.mutable_normalize() = *normalize;
  return Dataset::Load(spec);
}

// torch.save files Python wrote, read as data (worker/model/torch_save_file, worker/data).
TEST(TorchSaveData, PythonsFile_EverySplitShape_BatchesKeepTheirStructure) {
  const std::string file = testing::TestTempPath("splits.pt");
  Python(absl::StrCat(R"(
g = torch.Generator().manual_seed(0)
x = torch.randint(0, 256, (10, 1, 4, 4), dtype=torch.uint8, generator=g)
y = torch.arange(10)
torch.save({"train": (x, y),
            "val": {"image": x[:6].float(), "label": y[:6]},
            "test": [x[:3].float(), y[:3]],
            "predict": x[:2].float()}, ")",
                      file, R"(")
# One split only: Python pickles a one-item dict with SETITEM, which libtorch 1.13 cannot read.
torch.save({"train": {"only": y}}, ")",
                      file, R"(.one")
)"));
  absl::StatusOr<std::unique_ptr<Dataset>> data = LoadFile(file);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ((*data)->Splits(), (std::vector<std::pair<std::string, int64_t>>{
                                   {"train", 10}, {"val", 6}, {"test", 3}, {"predict", 2}}));
  absl::StatusOr<c10::IValue> train = (*data)->Batch("train", {4, 1});
  ASSERT_TRUE(train.ok()) << train.status();
  ASSERT_TRUE(train->isTuple());
  const at::Tensor x = train->toTupleRef().elements()[0].toTensor();
  EXPECT_EQ(x.scalar_type(), at::kByte) << "no normalization unless the spec asks for it";
  EXPECT_EQ(train->toTupleRef().elements()[1].toTensor()[0].item<int64_t>(), 4);
  absl::StatusOr<c10::IValue> val = (*data)->Batch("val", {5});
  ASSERT_TRUE(val.ok() && val->isGenericDict());
  EXPECT_EQ(val->toGenericDict().at("label").toTensor()[0].item<int64_t>(), 5);
  EXPECT_TRUE(val->toGenericDict().at("image").toTensor().is_floating_point());
  absl::StatusOr<c10::IValue> test = (*data)->Batch("test", {2});
  ASSERT_TRUE(test.ok() && test->isList());
  EXPECT_EQ(test->toList().size(), 2u);
  absl::StatusOr<c10::IValue> predict = (*data)->Batch("predict", {0, 1});
  ASSERT_TRUE(predict.ok() && predict->isTensor());
  EXPECT_EQ(predict->toTensor().size(0), 2);

  absl::StatusOr<std::unique_ptr<Dataset>> one = LoadFile(file + ".one");
  ASSERT_TRUE(one.ok()) << one.status();
  absl::StatusOr<c10::IValue> only = (*one)->Batch("train", {7});
  ASSERT_TRUE(only.ok() && only->isGenericDict());
  EXPECT_EQ(only->toGenericDict().at("only").toTensor()[0].item<int64_t>(), 7);
}

TEST(TorchSaveData, Normalize_ScalesUint8ThenPerChannel) {
  const std::string file = testing::TestTempPath("rgb.pt");
  Python(absl::StrCat(R"(
x = torch.tensor([[[[0]], [[255]], [[51]]]], dtype=torch.uint8).repeat(4, 1, 1, 1)
torch.save({"train": {"img": x, "y": torch.zeros(4, dtype=torch.long)}}, ")",
                      file, "\")\n"));
  v1::Normalize normalize;
  normalize.set_key("img");
  for (double m : {0.5, 0.5, 0.2}) normalize.add_mean(m);
  for (double s : {0.5, 0.25, 0.1}) normalize.add_std(s);
  absl::StatusOr<std::unique_ptr<Dataset>> data = LoadFile(file, &normalize);
  ASSERT_TRUE(data.ok()) << data.status();
  absl::StatusOr<c10::IValue> batch = (*data)->Batch("train", {0});
  ASSERT_TRUE(batch.ok()) << batch.status();
  const at::Tensor img = batch->toGenericDict().at("img").toTensor();
  EXPECT_NEAR(img[0][0][0][0].item<double>(), (0.0 - 0.5) / 0.5, 1e-6);
  EXPECT_NEAR(img[0][1][0][0].item<double>(), (1.0 - 0.5) / 0.25, 1e-6);
  EXPECT_NEAR(img[0][2][0][0].item<double>(), (0.2 - 0.2) / 0.1, 1e-6);
  // Every byte value in every channel, per channel and with one mean for all: bitwise as the
  // ATen ops compute it (the batch goes through a table per channel).
  const std::string every = testing::TestTempPath("every-byte.pt");
  Python(absl::StrCat(R"(
x = torch.arange(256, dtype=torch.uint8).view(1, 1, 16, 16).repeat(2, 3, 1, 1)
torch.save({"train": {"img": x, "y": torch.zeros(2, dtype=torch.long)}}, ")",
                      every, "\")\n"));
  const at::Tensor bytes = at::arange(256, at::kByte).view({1, 1, 16, 16}).repeat({2, 3, 1, 1});
  for (const bool per_channel : {true, false}) {
    v1::Normalize scale;
    scale.set_key("img");
    for (double m : per_channel ? std::vector<double>{0.5, 0.4, 0.2} : std::vector<double>{0.3}) {
      scale.add_mean(m);
    }
    for (double d : per_channel ? std::vector<double>{0.5, 0.25, 0.1} : std::vector<double>{0.7}) {
      scale.add_std(d);
    }
    absl::StatusOr<std::unique_ptr<Dataset>> all = LoadFile(every, &scale);
    ASSERT_TRUE(all.ok()) << all.status();
    absl::StatusOr<c10::IValue> got = (*all)->Batch("train", {0, 1});
    ASSERT_TRUE(got.ok()) << got.status();
    const std::vector<int64_t> shape =
        per_channel ? std::vector<int64_t>{1, 3, 1, 1} : std::vector<int64_t>{};
    const at::Tensor mean =
        at::tensor(std::vector<double>(scale.mean().begin(), scale.mean().end()), at::kFloat)
            .view(shape);
    const at::Tensor std =
        at::tensor(std::vector<double>(scale.std().begin(), scale.std().end()), at::kFloat)
            .view(shape);
    EXPECT_TRUE(at::equal(got->toGenericDict().at("img").toTensor(),
                          (bytes.to(at::kFloat) / 255.0 - mean) / std))
        << (per_channel ? "per channel" : "one mean");
  }
  normalize.set_key("pixels");
  absl::StatusOr<std::unique_ptr<Dataset>> wrong = LoadFile(file, &normalize);
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(wrong.status().message(), HasSubstr("has no tensor 'pixels'"));
}

TEST(TorchSaveData, BadFiles_ClearErrorsNamingTheFileAndTheKey) {
  const std::string base = testing::TestTempPath("bad");
  Python(absl::StrCat(R"(
torch.save({"train": (torch.zeros(5, 2), torch.zeros(4))}, ")",
                      base, R"(.ragged")
torch.save({"train": {"x": torch.zeros(5, 2), "n": 3}}, ")",
                      base, R"(.leaf")
torch.save({"train": (torch.zeros(5),), "extra": (torch.zeros(5),)}, ")",
                      base, R"(.key")
torch.save({"val": (torch.zeros(5),), "test": (torch.zeros(5),)}, ")",
                      base, R"(.notrain")
torch.save([torch.zeros(5)], ")",
                      base, R"(.list")
open(")",
                      base, R"(.text", "w").write("not torch")
)"));
  struct Case {
    std::string suffix, message;
  };
  for (const Case& c : std::vector<Case>{
           {".ragged", "': train[1] has 4 rows in dimension 0 but train[0] has 5"},
           {".leaf", "': train['n'] is a Int, not a tensor"},
           {".key", "' has a key 'extra'; its keys are the splits train, val, test and predict"},
           {".notrain", "' has no 'train' split"},
           {".list", "' holds a GenericList, not a dict of splits"},
           {".text", "' is not a file written by torch.save"},
       }) {
    absl::StatusOr<std::unique_ptr<Dataset>> data = LoadFile(base + c.suffix);
    EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument) << c.suffix;
    EXPECT_THAT(data.status().message(), HasSubstr(base + c.suffix + c.message));
  }
  EXPECT_EQ(LoadFile(base + ".absent").status().code(), absl::StatusCode::kNotFound);
}

// One-item dicts and lists as Python pickles them: `key value SETITEM` reads as
// `MARK key value SETITEMS`, `item APPEND` as `MARK item APPENDS`.
TEST(TorchSaveData, WithoutSingleItemOpcodes_RewritesOneItemDictsAndLists) {
  // PROTO 2, EMPTY_DICT, BINPUT 0, BINUNICODE "a", BININT1 1, SETITEM, STOP.
  const std::string pickle(
      "\x80\x02}q\x00X\x01\x00\x00\x00"
      "aK\x01s.",
      15);
  const std::string rewritten = WithoutSingleItemOpcodes(pickle);
  EXPECT_EQ(rewritten, std::string("\x80\x02}q\x00(X\x01\x00\x00\x00"
                                   "aK\x01u.",
                                   16));
  const std::string setitems(
      "\x80\x02}q\x00(X\x01\x00\x00\x00"
      "aK\x01u.",
      16);
  EXPECT_EQ(WithoutSingleItemOpcodes(setitems), setitems);
  // PROTO 2, EMPTY_LIST, BININT1 7, APPEND, STOP.
  EXPECT_EQ(WithoutSingleItemOpcodes(std::string("\x80\x02]K\x07"
                                                 "a.",
                                                 7)),
            std::string("\x80\x02](K\x07"
                        "e.",
                        8));
}

// What Lightning writes into a checkpoint beside tensors: a OneCycleLR state_dict's bound
// anneal_func (which pickles the scheduler, its optimizer and Parameters as that optimizer's
// state keys, and refers back to itself), MultiStepLR's Counter. libtorch refuses those
// classes; they read as empty lists, and everything else as Python wrote it.
TEST(TorchSaveData, PythonsObjects_ReadAsEmptyLists_TensorsIntact) {
  const std::string path = testing::TestTempPath("objects.ckpt");
  Python(absl::StrCat(R"(
import collections, torch
from torch.optim import lr_scheduler as S
p = torch.nn.Parameter(torch.ones(3))
o = torch.optim.SGD([p], lr=0.1, momentum=0.9)
one_cycle = S.OneCycleLR(o, max_lr=0.5, total_steps=10)
p.grad = torch.ones(3)
o.step()
one_cycle.step()
multi = S.MultiStepLR(torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1), [2, 2, 5])
torch.save({"state_dict": collections.OrderedDict(w=torch.arange(4.0)),
            "lr_schedulers": [one_cycle.state_dict(), multi.state_dict()],
            "epoch": 3}, ")",
                      path, R"(")
)"));
  absl::StatusOr<c10::IValue> read = ReadTorchSaveFile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  const c10::impl::GenericDict top = read->toGenericDict();
  EXPECT_TRUE(
      torch::equal(top.at("state_dict").toGenericDict().at("w").toTensor(), torch::arange(4.0)));
  EXPECT_EQ(top.at("epoch").toInt(), 3);
  const c10::impl::GenericDict one_cycle = top.at("lr_schedulers").toListRef()[0].toGenericDict();
  EXPECT_EQ(one_cycle.at("total_steps").toInt(), 10);
  EXPECT_EQ(one_cycle.at("last_epoch").toInt(), 1);
  ASSERT_TRUE(one_cycle.at("anneal_func").isList());
  EXPECT_EQ(one_cycle.at("anneal_func").toListRef().size(), 0u);
  const c10::impl::GenericDict multi = top.at("lr_schedulers").toListRef()[1].toGenericDict();
  EXPECT_EQ(multi.at("milestones").toListRef().size(), 0u);
  EXPECT_DOUBLE_EQ(multi.at("gamma").toDouble(), 0.1);
}

// The gate before libtorch's unpickler (issue 38): Python's own pickles pass; a pickle that
// would make libtorch pop an empty stack, size its memo by a crafted index or recurse a million
// levels is refused, naming the byte, and a file holding one is refused naming the file.
TEST(PickleCheck, PythonsPicklesPass_MalformedOnesRefusedNamingTheByte) {
  // pickle.dumps({"train": [1, 2.5, "x", (None, True)], "od": OrderedDict(w=2**40)}, protocol=2)
  const std::string python(
      "\x80\x02\x7d\x71\x00\x28\x58\x05\x00\x00\x00\x74\x72\x61\x69\x6e\x71\x01\x5d\x71\x02\x28"
      "\x4b\x01\x47\x40\x04\x00\x00\x00\x00\x00\x00\x58\x01\x00\x00\x00\x78\x71\x03\x4e\x88\x86"
      "\x71\x04\x65\x58\x02\x00\x00\x00\x6f\x64\x71\x05\x63\x63\x6f\x6c\x6c\x65\x63\x74\x69\x6f"
      "\x6e\x73\x0a\x4f\x72\x64\x65\x72\x65\x64\x44\x69\x63\x74\x0a\x71\x06\x29\x52\x71\x07\x58"
      "\x01\x00\x00\x00\x77\x71\x08\x8a\x06\x00\x00\x00\x00\x00\x01\x73\x75\x2e",
      106);
  EXPECT_TRUE(CheckPickle(python).ok()) << CheckPickle(python);
  EXPECT_TRUE(CheckPickle(WithoutSingleItemOpcodes(python)).ok());
  struct Case {
    std::string pickle;
    std::string message;
  };
  const std::string deep =
      absl::StrCat("\x80\x02", std::string(200, ']'), std::string(199, 'a'), ".");
  const std::vector<Case> cases = {
      {std::string("\x80\x02\x65.", 4), "at byte 2 (opcode 0x65): no MARK to pop to"},
      {std::string("\x80\x02]r\xff\xff\xff\x7f.", 9), "memo index 2147483647 skips past the 0"},
      {std::string("\x80\x02h\x03.", 5), "memo index 3 was never stored"},
      {deep, "values nest deeper than 100 levels"},
      {std::string("\x80\x02NN.", 5), "STOP with 2 values"},
      {std::string("\x80\x02X\xff\xff\xff\x00", 8), "truncated"},
      {std::string("\x80\x04N.", 4), "pickle protocol 4"},
      {std::string("\x80\x02N", 3), "ends without STOP"},
      {std::string("\x80\x02\x8a\x09", 4), "an integer of 9 bytes"},
      {std::string("\x80\x02(N(Nu.", 7), "SETITEMS with an odd number of items"},
  };
  for (const Case& c : cases) {
    const absl::Status status = CheckPickle(c.pickle);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(std::string(status.message()), HasSubstr(c.message));
  }
  // A torch.save file whose data.pkl underflows the stack: refused before libtorch reads it.
  const std::string file = testing::TestTempPath("underflow.pt");
  Python(absl::StrCat(R"(
import zipfile
with zipfile.ZipFile(")",
                      file, R"(", "w") as z:
    z.writestr("archive/data.pkl", b"\x80\x02e.")
    z.writestr("archive/version", "3\n")
)"));
  absl::StatusOr<c10::IValue> read = ReadTorchSaveFile(file);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(read.status().message()),
              HasSubstr("is not a torch.save file dtrain reads: its data.pkl has a malformed "
                        "pickle at byte 2"));
}

// A storage must hold what it declares, and a tensor must lie inside its storage: libtorch's
// unpickler checks neither, so such a file read the worker's heap (issue 38). Files crafted in
// Python with torch.save's layout; the last one, well formed, still loads.
TEST(PickleCheck, StoragesAndTensorViewsOutOfRange_Refused) {
  const std::string base = testing::TestTempPath("views");
  Python(absl::StrCat(R"(
import collections, io, pickle, struct, zipfile
class Storage:
    def __init__(self, n): self.n = n
class Pickler(pickle.Pickler):
    def persistent_id(self, obj):
        return ("storage", torch.FloatStorage, "0", "cpu", obj.n) if isinstance(obj, Storage) else None
class Tensor:
    def __init__(self, *args): self.args = args
    def __reduce__(self): return (torch._utils._rebuild_tensor_v2, self.args)
def write(path, declared, offset, size, stride):
    buf = io.BytesIO()
    Pickler(buf, protocol=2).dump(
        {"x": Tensor(Storage(declared), offset, size, stride, False, collections.OrderedDict())})
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", buf.getvalue())
        z.writestr("archive/data/0", struct.pack("<2f", 1.5, -2.0))
        z.writestr("archive/version", "3\n")
base = ")",
                      base, R"("
write(base + ".short.pt", 1000, 0, (1000,), (1,))
write(base + ".offset.pt", 2, 5, (2,), (1,))
write(base + ".stride.pt", 2, 0, (2, 2), (1, 1 << 20))
write(base + ".negative.pt", 2, 1, (2,), (-1,))
write(base + ".good.pt", 2, 0, (2,), (1,))
)"));
  struct Case {
    std::string suffix;
    std::string message;
  };
  const std::vector<Case> cases = {
      {".short.pt", "storage '0' declares 4000 bytes but its record holds 8"},
      {".offset.pt",
       "a tensor of sizes [2], strides [1] and offset 5 reaches beyond its storage "
       "of 8 bytes"},
      {".stride.pt", "reaches beyond its storage of 8 bytes"},
      {".negative.pt", "reaches beyond its storage of 8 bytes"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<c10::IValue> read = ReadTorchSaveFile(base + c.suffix);
    EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument) << c.suffix;
    EXPECT_THAT(std::string(read.status().message()), HasSubstr(c.message)) << c.suffix;
  }
  absl::StatusOr<c10::IValue> good = ReadTorchSaveFile(base + ".good.pt");
  ASSERT_TRUE(good.ok()) << good.status();
  const at::Tensor x = good->toGenericDict().at("x").toTensor();
  EXPECT_EQ(x.sizes(), (std::vector<int64_t>{2}));
  EXPECT_FLOAT_EQ(x[0].item<float>(), 1.5f);
  EXPECT_FLOAT_EQ(x[1].item<float>(), -2.0f);
}

// A file written on GPUs (issue 39): its storages' persistent ids name cuda:0 and cuda:1, as
// torch.save writes them for CUDA tensors (crafted here, on a machine without one). dtrain reads
// it as torch.load(map_location="cpu") does: every tensor on the CPU with its values, where
// libtorch would have moved each to the device its file names (and failed without CUDA).
TEST(TorchSaveData, StoragesTaggedCuda_LoadOnTheCpu) {
  const std::string path = testing::TestTempPath("cuda-tagged.pt");
  Python(absl::StrCat(R"(
import collections, io, pickle, struct, zipfile
class Storage:
    def __init__(self, key, location): self.key, self.location = key, location
class Pickler(pickle.Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, Storage):
            return ("storage", torch.FloatStorage, obj.key, obj.location, 2)
        return None
class Tensor:
    def __init__(self, *args): self.args = args
    def __reduce__(self): return (torch._utils._rebuild_tensor_v2, self.args)
buf = io.BytesIO()
Pickler(buf, protocol=2).dump({
    "a": Tensor(Storage("0", "cuda:0"), 0, (2,), (1,), False, collections.OrderedDict()),
    "b": Tensor(Storage("1", "cuda:1"), 0, (2,), (1,), False, collections.OrderedDict())})
with zipfile.ZipFile(")",
                      path, R"(", "w") as z:
    z.writestr("archive/data.pkl", buf.getvalue())
    z.writestr("archive/data/0", struct.pack("<2f", 1.5, -2.0))
    z.writestr("archive/data/1", struct.pack("<2f", 3.0, 4.5))
    z.writestr("archive/version", "3\n")
)"));
  absl::StatusOr<c10::IValue> read = ReadTorchSaveFile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  const c10::Dict<c10::IValue, c10::IValue> dict = read->toGenericDict();
  const at::Tensor a = dict.at("a").toTensor();
  const at::Tensor b = dict.at("b").toTensor();
  EXPECT_TRUE(a.device().is_cpu());
  EXPECT_TRUE(b.device().is_cpu());
  EXPECT_FLOAT_EQ(a[1].item<float>(), -2.0f);
  EXPECT_FLOAT_EQ(b[0].item<float>(), 3.0f);
  EXPECT_FLOAT_EQ(b[1].item<float>(), 4.5f);
}

// Data is never code (issue 38). A TorchScript archive whose __setstate__ creates a file through
// torch.from_file, the way one could overwrite the worker's token file: as data or through the
// torch.save reader it is refused naming the file, and the file is never created; Python's
// torch.jit.load of the same archive does create it, so the archive really carries that code.
TEST(DataIsNeverCode, TorchScriptArchive_Refused_ItsSetstateNeverRuns) {
  const std::string archive = testing::TestTempPath("setstate.pt");
  const std::string marker = testing::TestTempPath("setstate.ran");
  std::remove(marker.c_str());
  Python(absl::StrCat(R"(
from typing import Tuple
class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.x = torch.zeros(3)
    @torch.jit.export
    def __getstate__(self) -> Tuple[torch.Tensor, bool]:
        return (self.x, self.training)
    @torch.jit.export
    def __setstate__(self, s: Tuple[torch.Tensor, bool]) -> None:
        self.x = torch.from_file(")",
                      marker, R"(", True, 8, dtype=torch.uint8)
        self.training = s[1]
torch.jit.save(torch.jit.script(M()), ")",
                      archive, R"(")
)"));
  absl::StatusOr<std::unique_ptr<Dataset>> data = LoadFile(archive);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(data.status().message()),
              HasSubstr("'" + archive + "' is a TorchScript archive (it holds code/"));
  absl::StatusOr<c10::IValue> read = ReadTorchSaveFile(archive);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(read.status().message()),
              HasSubstr("are never run as code; write it with torch.save(obj, path)"));
  EXPECT_FALSE(std::ifstream(marker).good()) << "the archive's __setstate__ ran";
  Python(absl::StrCat("torch.jit.load(\"", archive, "\")\n"));
  EXPECT_TRUE(std::ifstream(marker).good())
      << "the archive carries no code: the test proves nothing";
}

// A pickle may construct only what pickle_check.h lists. Python objects of any other class,
// os.system's REDUCE and a TorchScript class among them, load as inert empty lists and nothing
// is called; tensors beside them are intact. A raw pickle naming such a global, a REDUCE of a
// storage type's index, and a type tag long enough to recurse deeply are refused.
TEST(DataIsNeverCode, GlobalsOffTheList_NeverConstructed) {
  const std::string file = testing::TestTempPath("globals.pt");
  const std::string marker = testing::TestTempPath("globals.ran");
  std::remove(marker.c_str());
  Python(absl::StrCat(R"(
import os
class Evil:
    def __reduce__(self): return (os.system, ("touch )",
                      marker, R"(",))
torch.save({"evil": Evil(), "x": torch.arange(3.0)}, ")",
                      file, R"(")
)"));
  absl::StatusOr<c10::IValue> read = ReadTorchSaveFile(file);
  ASSERT_TRUE(read.ok()) << read.status();
  const c10::impl::GenericDict top = read->toGenericDict();
  ASSERT_TRUE(top.at("evil").isList());
  EXPECT_EQ(top.at("evil").toListRef().size(), 0u);
  EXPECT_TRUE(torch::equal(top.at("x").toTensor(), torch::arange(3.0)));
  EXPECT_FALSE(std::ifstream(marker).good()) << "os.system ran";

  struct Case {
    std::string pickle;
    std::string message;
  };
  const std::vector<Case> cases = {
      {std::string("\x80\x02\x63posix\nsystem\nX\x01\x00\x00\x00x\x85R.", 25),
       "at byte 2 names posix.system, which dtrain never builds from a file"},
      {std::string("\x80\x02\x63__torch__\nM\n)R.", 18), "names __torch__.M"},
      {std::string("\x80\x02\x63torch.distributed.rpc\nrref\n)R.", 33),
       "names torch.distributed.rpc.rref"},
      {std::string("\x80\x02\x63torch\nFloatStorage\n)R.", 25),
       "calls something other than a class or function"},
      {absl::StrCat(
           std::string("\x80\x02\x63torch.jit._pickle\nrestore_type_tag\n]X\x2c\x01\0\0", 44),
           std::string(300, '['), "\x86R."),
       "restore_type_tag without a value and a type string of at most 256 bytes"},
  };
  for (const Case& c : cases) {
    const absl::Status status = CheckPickle(c.pickle);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(std::string(status.message()), HasSubstr(c.message));
  }
  EXPECT_TRUE(IsConstructedGlobal("torch._utils", "_rebuild_tensor_v2"));
  EXPECT_FALSE(IsConstructedGlobal("torch._utils", "_rebuild_sparse_tensor"));
}

// The pickle rewrite runs before any check, on whatever a file holds: its memory stays a small
// multiple of the pickle for the shapes that cost it most (one-item APPENDs and SETITEMs, many
// marks, OrderedDicts and Python objects, memoized items), where it was 30-40x. The rewritten
// pickle itself is part of the count.
TEST(PickleRewrite, MemoryASmallMultipleOfThePickle) {
  auto repeat = [](const std::string& head, const std::string& unit, const std::string& tail,
                   size_t bytes) {
    std::string out = head;
    while (out.size() < bytes) out += unit;
    return out + tail;
  };
  using namespace std::string_literals;  // NOLINT: pickles hold NUL bytes
  constexpr size_t kBytes = 1 << 20;
  // Items memoized at growing indices, each appended alone.
  std::string memoized = "\x80\x02]"s;
  for (uint32_t index = 0; memoized.size() < kBytes; ++index) {
    memoized += "}r"s;
    for (int k = 0; k < 4; ++k) memoized.push_back(static_cast<char>((index >> (8 * k)) & 0xff));
    memoized += "a"s;
  }
  memoized += "."s;
  struct Shape {
    const char* name;
    std::string pickle;
  };
  const std::vector<Shape> shapes = {
      {"one-item appends", repeat("\x80\x02]"s, "Na"s, "."s, kBytes)},
      {"one-item setitems", repeat("\x80\x02}"s, "NNs"s, "."s, kBytes)},
      {"marks and lists", repeat("\x80\x02]"s, "(Nla"s, "."s, kBytes)},
      {"memoized items", memoized},
      {"ordered dicts",
       repeat("\x80\x02](ccollections\nOrderedDict\nq\x00)R"s, "h\x00)R"s, "e."s, kBytes)},
      {"python objects", repeat("\x80\x02](cmod\nCls\nq\x00)R"s, "h\x00)R"s, "e."s, kBytes)},
  };
  for (const Shape& shape : shapes) {
    std::string rewritten;
    const int64_t peak = PeakHeapBytes([&] { rewritten = WithoutSingleItemOpcodes(shape.pickle); });
    const double ratio = static_cast<double>(peak) / static_cast<double>(shape.pickle.size());
    std::cout << shape.name << ": " << shape.pickle.size() << " bytes, rewritten to "
              << rewritten.size() << ", peak heap " << peak << " (" << ratio << "x)\n";
    EXPECT_NE(rewritten, shape.pickle) << shape.name << ": nothing was rewritten";
    EXPECT_LT(ratio, 10.0) << shape.name;
  }
}

// What dtrain writes (checkpoints) loads in torch.load with weights_only=True, torch 2.6's
// default (kWeightsOnlyLoad checks its globals): libtorch's pickler would wrap lists of ints,
// floats and tensors in torch.jit._pickle.build_*list and every list and dict in restore_type_tag,
// which that unpickler refuses. Values and tensors come back as written, in Python and in dtrain.
TEST(TorchSaveWrite, TypedListsAndDicts_LoadWithWeightsOnly_ValuesKept) {
  c10::impl::GenericList params(c10::IntType::get());
  params.push_back(0);
  params.push_back(3);
  c10::impl::GenericList rates(c10::FloatType::get());
  rates.push_back(0.1);
  c10::impl::GenericList tensors(c10::TensorType::get());
  tensors.push_back(torch::arange(6, torch::kFloat32).reshape({2, 3}));
  tensors.push_back(torch::tensor({true, false}));
  c10::impl::GenericList flags(c10::BoolType::get());
  flags.push_back(true);
  c10::impl::GenericDict state(c10::StringType::get(), c10::TensorType::get());
  state.insert("w", torch::full({2}, 1.5, torch::kFloat64));
  c10::impl::GenericDict group(c10::StringType::get(), c10::AnyType::get());
  group.insert("params", params);
  group.insert("lr", rates);
  group.insert("flags", flags);
  group.insert("pair", c10::ivalue::Tuple::create({c10::IValue(int64_t{7}), tensors}));
  c10::impl::GenericDict top(c10::StringType::get(), c10::AnyType::get());
  top.insert("state_dict", state);
  top.insert("group", group);
  top.insert("tensors", tensors);
  top.insert("global_step", int64_t{32});
  const std::string path = testing::TestTempPath("untagged.ckpt");
  ASSERT_TRUE(WriteTorchSaveFile(path, top).ok());

  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(bytes.find("torch.jit"), std::string::npos) << "a type tag or typed list was written";
  Python(absl::StrCat(testing::kWeightsOnlyLoad, "c = weights_only_load('", path, R"(')
assert c["global_step"] == 32, c
assert torch.equal(c["state_dict"]["w"], torch.full((2,), 1.5, dtype=torch.float64))
g = c["group"]
assert g["params"] == [0, 3] and g["lr"] == [0.1] and g["flags"] == [True], g
assert g["pair"][0] == 7 and torch.equal(g["pair"][1][0], torch.arange(6.).reshape(2, 3))
assert torch.equal(c["tensors"][1], torch.tensor([True, False])), c["tensors"]
)"));

  absl::StatusOr<c10::IValue> back = ReadTorchSaveFile(path);
  ASSERT_TRUE(back.ok()) << back.status();
  const c10::Dict<c10::IValue, c10::IValue> read = back->toGenericDict();
  EXPECT_EQ(read.at("global_step").toInt(), 32);
  EXPECT_TRUE(torch::equal(read.at("state_dict").toGenericDict().at("w").toTensor(),
                           torch::full({2}, 1.5, torch::kFloat64)));
  const c10::List<c10::IValue> ints = read.at("group").toGenericDict().at("params").toList();
  ASSERT_EQ(ints.size(), 2u);
  EXPECT_EQ(ints.get(1).toInt(), 3);
  EXPECT_TRUE(torch::equal(read.at("tensors").toList().get(0).toTensor(),
                           torch::arange(6, torch::kFloat32).reshape({2, 3})));
}

}  // namespace torch_save_file_test
}  // namespace dtrain
