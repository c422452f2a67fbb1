#include "worker/dataset.h"

#include <fstream>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/serialize/input-archive.h>

#include "absl/strings/str_cat.h"
#include "common/job_settings.h"
#include "common/status_macros.h"
#include "worker/idx_file.h"
#include "worker/torch_status.h"

namespace dtrain {
namespace {

constexpr double kFashionMean = 0.2860;
constexpr double kFashionStd = 0.3530;

absl::StatusOr<at::Tensor> ReadIdxTensor(const std::string& path) {
  DTRAIN_ASSIGN_OR_RETURN(IdxArray array, ReadIdxGz(path));
  at::Tensor t = at::empty(array.shape, at::kByte);
  std::memcpy(t.data_ptr(), array.data.data(), array.data.size());
  return t;
}

}  // namespace

std::pair<at::Tensor, at::Tensor> Dataset::Synthetic(int64_t n, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  at::Tensor y = at::randint(0, 10, {n}, gen, at::kLong);
  at::Tensor x = at::randn({n, 1, 28, 28}, gen) * 0.3;
  // Class c brightens rows 2c..2c+2: a mask per sample, built without a per-sample loop.
  at::Tensor rows = at::arange(28, at::kLong).view({1, 28});
  at::Tensor first = (2 * y).view({n, 1});
  at::Tensor mask = ((rows >= first) & (rows < first + 3)).to(at::kFloat);
  x += mask.view({n, 1, 28, 1});
  return {x, y};
}

absl::StatusOr<std::unique_ptr<Dataset>> Dataset::Load(const v1::DataSpec& spec) {
  std::unique_ptr<Dataset> data(new Dataset());
  switch (spec.source_case()) {
    case v1::DataSpec::kBuiltin: {
      if (spec.builtin() != "fashion-mnist") {
        return absl::InvalidArgumentError(absl::StrCat("unknown builtin dataset '", spec.builtin(),
                                                       "'; the builtin is fashion-mnist"));
      }
      const std::string dir = spec.data_dir().empty() ? kFashionMnistDir : spec.data_dir();
      auto read = [&](const std::string& name) -> absl::StatusOr<at::Tensor> {
        absl::StatusOr<at::Tensor> t = ReadIdxTensor(dir + "/" + name);
        if (t.status().code() == absl::StatusCode::kNotFound) {
          return absl::NotFoundError(
              absl::StrCat(t.status().message(),
                           "; install Debian's dataset-fashion-mnist "
                           "(apt-get install dataset-fashion-mnist) or set data_dir"));
        }
        return t;
      };
      DTRAIN_ASSIGN_OR_RETURN(at::Tensor train_x, read("train-images-idx3-ubyte.gz"));
      DTRAIN_ASSIGN_OR_RETURN(at::Tensor train_y, read("train-labels-idx1-ubyte.gz"));
      DTRAIN_ASSIGN_OR_RETURN(at::Tensor test_x, read("t10k-images-idx3-ubyte.gz"));
      DTRAIN_ASSIGN_OR_RETURN(at::Tensor test_y, read("t10k-labels-idx1-ubyte.gz"));
      if (train_x.dim() != 3 || train_x.size(0) != train_y.size(0) ||
          test_x.size(0) != test_y.size(0)) {
        return absl::InvalidArgumentError(
            absl::StrCat("the Fashion-MNIST files in '", dir, "' disagree on their sample counts"));
      }
      const int64_t val = spec.val_size() > 0 ? spec.val_size() : kDefaultValSize;
      const int64_t n = train_x.size(0);
      if (val >= n) {
        return absl::InvalidArgumentError(
            absl::StrCat("val_size ", val, " leaves no training images of ", n));
      }
      train_x = train_x.unsqueeze(1);
      test_x = test_x.unsqueeze(1);
      train_y = train_y.to(at::kLong);
      data->splits_["train"] = {train_x.slice(0, 0, n - val), train_y.slice(0, 0, n - val)};
      data->splits_["val"] = {train_x.slice(0, n - val), train_y.slice(0, n - val)};
      data->splits_["test"] = {test_x, test_y.to(at::kLong)};
      break;
    }
    case v1::DataSpec::kSynthetic: {
      const v1::SyntheticDataSpec& s = spec.synthetic();
      if (s.train_size() <= 0 || s.val_size() < 0 || s.test_size() < 0) {
        return absl::InvalidArgumentError(
            "synthetic data needs train_size > 0 and val_size, test_size >= 0");
      }
      if (s.train_size() + s.val_size() + s.test_size() > (int64_t{1} << 22)) {
        return absl::InvalidArgumentError("synthetic data is limited to 4,194,304 samples");
      }
      auto [x, y] = Synthetic(s.train_size(), s.seed());
      data->splits_["train"] = {x, y};
      if (s.val_size() > 0) {
        auto [vx, vy] = Synthetic(s.val_size(), s.seed() + 1000003);
        data->splits_["val"] = {vx, vy};
      }
      if (s.test_size() > 0) {
        auto [tx, ty] = Synthetic(s.test_size(), s.seed() + 2000003);
        data->splits_["test"] = {tx, ty};
      }
      break;
    }
    case v1::DataSpec::kTensorsFile: {
      const std::string& path = spec.tensors_file();
      if (!std::ifstream(path).good()) {
        return absl::NotFoundError(absl::StrCat("tensors file '", path, "' does not exist"));
      }
      DTRAIN_RETURN_IF_ERROR(
          GuardTorch(absl::StrCat("cannot read tensors file '", path, "'"), [&]() -> absl::Status {
            torch::serialize::InputArchive archive;
            archive.load_from(path);
            for (const char* name : {"train", "val", "test"}) {
              at::Tensor x, y;
              const bool has_x = archive.try_read(absl::StrCat(name, "/x"), x);
              const bool has_y = archive.try_read(absl::StrCat(name, "/y"), y);
              if (!has_x && !has_y) continue;
              if (!has_x || !has_y || x.dim() == 0 || y.dim() == 0 || x.size(0) != y.size(0)) {
                return absl::InvalidArgumentError(
                    absl::StrCat("tensors file '", path, "': split ", name,
                                 " needs x and y with the same size in dimension 0"));
              }
              data->splits_[name] = {x, y};
            }
            if (data->splits_.count("train") == 0) {
              return absl::InvalidArgumentError(
                  absl::StrCat("tensors file '", path, "' has no train/x and train/y"));
            }
            return absl::OkStatus();
          }));
      break;
    }
    default:
      return absl::InvalidArgumentError("data needs one of builtin, synthetic or tensors_file");
  }
  return data;
}

std::vector<std::pair<std::string, int64_t>> Dataset::Splits() const {
  std::vector<std::pair<std::string, int64_t>> out;
  for (const char* name : {"train", "val", "test"}) {
    auto it = splits_.find(name);
    if (it != splits_.end()) out.emplace_back(name, it->second.x.size(0));
  }
  return out;
}

absl::StatusOr<c10::IValue> Dataset::Batch(const std::string& split,
                                           const std::vector<int64_t>& indices) const {
  auto it = splits_.find(split);
  if (it == splits_.end()) {
    return absl::InvalidArgumentError(absl::StrCat("the dataset has no split '", split, "'"));
  }
  if (indices.empty()) return absl::InvalidArgumentError("an index batch needs indices");
  const int64_t size = it->second.x.size(0);
  for (int64_t i : indices) {
    if (i < 0 || i >= size) {
      return absl::InvalidArgumentError(
          absl::StrCat("index ", i, " is outside split '", split, "' of ", size, " samples"));
    }
  }
  at::Tensor index = at::tensor(indices, at::kLong);
  at::Tensor x = it->second.x.index_select(0, index);
  if (x.scalar_type() == at::kByte) {
    x = (x.to(at::kFloat) / 255.0 - kFashionMean) / kFashionStd;
  }
  return c10::ivalue::Tuple::create({x, it->second.y.index_select(0, index)});
}

}  // namespace dtrain
