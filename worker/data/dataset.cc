#include "worker/data/dataset.h"

#include <algorithm>
#include <array>
#include <fstream>
#include <functional>
#include <optional>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/job_settings.h"
#include "common/status_macros.h"
#include "worker/data/http_shard_fetcher.h"
#include "worker/data/idx_file.h"
#include "worker/data/pixel_normalize.h"
#include "worker/data/sample_decoder.h"
#include "worker/data/sharded_split.h"
#include "worker/model/batch_tree.h"
#include "worker/model/torch_save_file.h"
#include "worker/model/torch_status.h"

namespace dtrain {
namespace {

constexpr double kFashionMean = 0.2860;
constexpr double kFashionStd = 0.3530;

// uint8 values as (x / 255 - mean) / std in float, one mean and std for all or one per channel
// (dimension 1), bitwise as the ATen ops `(x.to(kFloat) / 255.0 - mean) / std` compute it with
// float means and stds, in one pass through PixelNormalize's tables instead of four passes and
// tensors (12 against 20 us for the MLP's batch of 64 with its gather: docs/BENCHMARKS.md).
// nullopt when the shapes do not fit that (the ATen ops then say what is wrong).
std::optional<at::Tensor> NormalizedBytes(const at::Tensor& bytes, const std::vector<float>& means,
                                          const std::vector<float>& stds) {
  const int64_t channels = static_cast<int64_t>(means.size());
  if (bytes.scalar_type() != at::kByte || bytes.numel() == 0 || channels == 0 ||
      stds.size() != means.size() ||
      (channels > 1 && (bytes.dim() < 2 || bytes.size(1) != channels))) {
    return std::nullopt;
  }
  const at::Tensor x = bytes.contiguous();
  at::Tensor out = at::empty(x.sizes(), x.options().dtype(at::kFloat));
  const PixelNormalizeSpec spec{false, means, stds};
  std::vector<std::array<float, 256>> tables;
  for (int c = 0; c < channels; ++c) {
    tables.push_back(PixelNormalizeTable(spec, static_cast<int>(channels), c));
  }
  // Planes of one channel each: the whole tensor for one mean, else each sample's channels.
  const int64_t planes = channels == 1 ? 1 : x.size(0) * channels;
  const int64_t plane = x.numel() / planes;
  const uint8_t* in = x.data_ptr<uint8_t>();
  float* to = out.data_ptr<float>();
  for (int64_t p = 0; p < planes; ++p) {
    const float* table = tables[p % channels].data();
    for (int64_t i = p * plane; i < (p + 1) * plane; ++i) to[i] = table[in[i]];
  }
  return out;
}

constexpr const char* kSplitNames[] = {"train", "val", "test", "predict"};

constexpr char kFormatHint[] =
    "; write it in Python with torch.save({\"train\": (x, y), \"val\": (x, y)}, path) (each "
    "split a tuple or list of tensors, or a dict of named tensors; see docs/data.md)";

// The tensor `key` selects in a batch or split structure: a dict key, or a position in a tuple
// or list ("0"); nullopt when there is none.
std::optional<at::Tensor> SelectTensor(const c10::IValue& columns, const std::string& key) {
  if (columns.isGenericDict()) {
    const c10::impl::GenericDict dict = columns.toGenericDict();
    auto it = dict.find(c10::IValue(key));
    if (it == dict.end() || !it->value().isTensor()) return std::nullopt;
    return it->value().toTensor();
  }
  int64_t index = -1;
  if (!absl::SimpleAtoi(key, &index) || index < 0) return std::nullopt;
  if (columns.isTensor()) {
    return index == 0 ? std::optional<at::Tensor>(columns.toTensor()) : std::nullopt;
  }
  std::vector<c10::IValue> items;
  if (columns.isTuple()) items = columns.toTupleRef().elements().vec();
  if (columns.isList()) items = columns.toList().vec();
  if (index >= static_cast<int64_t>(items.size()) || !items[index].isTensor()) return std::nullopt;
  return items[index].toTensor();
}

// `batch` with the tensor `key` selects replaced by fn(tensor).
c10::IValue MapSelected(const c10::IValue& batch, const std::string& key,
                        const std::function<at::Tensor(const at::Tensor&)>& fn) {
  if (batch.isGenericDict()) {
    c10::impl::GenericDict in = batch.toGenericDict();
    c10::impl::GenericDict out(in.keyType(), in.valueType());
    for (const auto& entry : in) {
      const bool selected = entry.key().isString() && entry.key().toStringRef() == key;
      out.insert(entry.key(), selected ? c10::IValue(fn(entry.value().toTensor())) : entry.value());
    }
    return out;
  }
  int64_t index = -1;
  if (!absl::SimpleAtoi(key, &index)) return batch;
  if (batch.isTensor()) return index == 0 ? c10::IValue(fn(batch.toTensor())) : batch;
  if (batch.isTuple()) {
    std::vector<c10::IValue> items = batch.toTupleRef().elements().vec();
    if (index >= 0 && index < static_cast<int64_t>(items.size()) && items[index].isTensor()) {
      items[index] = fn(items[index].toTensor());
    }
    return c10::ivalue::Tuple::create(std::move(items));
  }
  if (batch.isList()) {
    c10::impl::GenericList list = batch.toList().copy();
    if (index >= 0 && index < static_cast<int64_t>(list.size())) {
      list.set(index, fn(list.get(index).toTensor()));
    }
    return list;
  }
  return batch;
}

// The builtin datasets' (x, y) split.
Dataset::Split XY(at::Tensor x, at::Tensor y) {
  Dataset::Split split;
  split.columns = c10::ivalue::Tuple::create({std::move(x), std::move(y)});
  split.size = split.columns.toTupleRef().elements()[0].toTensor().size(0);
  return split;
}

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

Dataset::~Dataset() = default;

absl::StatusOr<std::unique_ptr<Dataset>> Dataset::Load(const v1::DataConfig& spec,
                                                       const DataLoadOptions& options) {
  std::unique_ptr<Dataset> data(new Dataset());
  switch (spec.source_case()) {
    case v1::DataConfig::kShards: {
      const v1::ShardDataSpec& shards = spec.shards();
      ShardFetcher fetcher = options.fetcher;
      if (!fetcher.url) {
        // URLs through libcurl with retries, backoff and stall timeouts (http_shard_fetcher.h).
        fetcher.url = UrlFetcher(HttpFetchOptions());
      }
      const std::pair<const char*, const std::string*> named[] = {{"train", &shards.train()},
                                                                  {"val", &shards.val()},
                                                                  {"test", &shards.test()},
                                                                  {"predict", &shards.predict()}};
      for (const auto& [name, value] : named) {
        if (value->empty()) continue;
        const std::string field = absl::StrCat("shards.", name);
        ShardedSplitOptions o;
        o.name = name;
        DTRAIN_ASSIGN_OR_RETURN(o.catalog,
                                ResolveShards(*value, field, fetcher, options.load_cancelled));
        if (o.catalog.samples == 0) {
          return absl::InvalidArgumentError(
              absl::StrCat(field, ": the shards '", *value, "' hold no samples"));
        }
        o.fetcher = fetcher;
        o.training = std::string(name) == "train";
        o.shuffle = !spec.has_shuffle() || spec.shuffle();
        o.seed = options.seed;
        o.shuffle_buffer = static_cast<size_t>(std::max(0, shards.shuffle_buffer()));
        o.skip_errors = shards.on_error() == "skip";
        o.num_workers = std::max(0, spec.num_workers());
        // The batch size is the coordinator's setting, cleared from the spec a worker gets:
        // the split takes it from the first batch the step asks for (docs/DECISIONS.md).
        o.window = 2 * std::max(1, spec.num_workers());
        o.prefetch_batches = std::max(1, spec.prefetch_batches());
        DTRAIN_ASSIGN_OR_RETURN(o.decode,
                                MakeSampleDecoder(shards.fields(), spec, options.seed, o.training));
        o.cancelled = options.cancelled;
        for (const v1::ShardField& f : shards.fields()) {
          for (absl::string_view n : absl::StrSplit(f.name(), ';', absl::SkipWhitespace())) {
            o.keep_fields.insert(absl::AsciiStrToLower(absl::StripAsciiWhitespace(n)));
          }
        }
        data->streamed_[name] = std::make_unique<ShardedSplit>(std::move(o));
      }
      if (data->streamed_.count("train") == 0 && data->streamed_.count("predict") == 0) {
        return absl::InvalidArgumentError(
            "shards: give train (or predict, for predict only): a pattern, directory or list file");
      }
      break;
    }
    case v1::DataConfig::kBuiltin: {
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
      const int64_t val =
          spec.val_size() > 0 ? spec.val_size() : JobSpecDefaults().data().val_size();
      const int64_t n = train_x.size(0);
      if (val >= n) {
        return absl::InvalidArgumentError(
            absl::StrCat("val_size ", val, " leaves no training images of ", n));
      }
      train_x = train_x.unsqueeze(1);
      test_x = test_x.unsqueeze(1);
      train_y = train_y.to(at::kLong);
      data->splits_["train"] = XY(train_x.slice(0, 0, n - val), train_y.slice(0, 0, n - val));
      data->splits_["val"] = XY(train_x.slice(0, n - val), train_y.slice(0, n - val));
      data->splits_["test"] = XY(test_x, test_y.to(at::kLong));
      data->fashion_normalize_ = true;
      break;
    }
    case v1::DataConfig::kSynthetic: {
      const v1::SyntheticDataSpec& s = spec.synthetic();
      if (s.train_size() <= 0 || s.val_size() < 0 || s.test_size() < 0) {
        return absl::InvalidArgumentError(
            "synthetic data needs train_size > 0 and val_size, test_size >= 0");
      }
      if (s.train_size() + s.val_size() + s.test_size() > (int64_t{1} << 22)) {
        return absl::InvalidArgumentError("synthetic data is limited to 4,194,304 samples");
      }
      auto [x, y] = Synthetic(s.train_size(), s.seed());
      data->splits_["train"] = XY(x, y);
      if (s.val_size() > 0) {
        auto [vx, vy] = Synthetic(s.val_size(), s.seed() + 1000003);
        data->splits_["val"] = XY(vx, vy);
      }
      if (s.test_size() > 0) {
        auto [tx, ty] = Synthetic(s.test_size(), s.seed() + 2000003);
        data->splits_["test"] = XY(tx, ty);
      }
      break;
    }
    case v1::DataConfig::kTensorsFile:
      DTRAIN_RETURN_IF_ERROR(data->LoadTensorsFile(spec.tensors_file()));
      if (spec.has_normalize()) {
        const v1::Normalize& n = spec.normalize();
        if (n.mean_size() == 0 || n.mean_size() != n.std_size()) {
          return absl::InvalidArgumentError(
              "normalize: give mean and std, as one value each or one per channel");
        }
        for (double v : n.std()) {
          if (!(v > 0)) return absl::InvalidArgumentError("normalize: every std must be > 0");
        }
        const std::string key = n.key().empty()
                                    ? FindJobSetting("data.normalize.key")->setting->default_value()
                                    : n.key();
        for (const auto& [name, split] : data->splits_) {
          if (!SelectTensor(split.columns, key).has_value()) {
            return absl::InvalidArgumentError(
                absl::StrCat("normalize.key: split '", name, "' of '", spec.tensors_file(),
                             "' has no tensor '", key, "' (a dict key, or a position in a tuple)"));
          }
        }
        data->normalize_ = n;
        data->normalize_->set_key(key);
      }
      break;
    default:
      return absl::InvalidArgumentError("data needs one of builtin, synthetic or tensors_file");
  }
  return data;
}

std::vector<std::pair<std::string, int64_t>> Dataset::Splits() const {
  std::vector<std::pair<std::string, int64_t>> out;
  for (const char* name : kSplitNames) {
    if (auto s = streamed_.find(name); s != streamed_.end()) {
      out.emplace_back(name, s->second->TotalSamples());
      continue;
    }
    auto it = splits_.find(name);
    if (it != splits_.end()) out.emplace_back(name, it->second.size);
  }
  return out;
}

absl::StatusOr<Dataset::Split> Dataset::CheckSplit(const std::string& path, const std::string& name,
                                                   const c10::IValue& value) {
  const std::string where = absl::StrCat("tensors file '", path, "': split '", name, "'");
  // (label, tensor) of each leaf, in order.
  std::vector<std::pair<std::string, c10::IValue>> leaves;
  Split split;
  if (value.isTensor()) {
    leaves.emplace_back(name, value);
    split.columns = value;
  } else if (value.isTuple() || value.isList()) {
    std::vector<c10::IValue> items =
        value.isTuple() ? value.toTupleRef().elements().vec() : value.toList().vec();
    c10::List<at::Tensor> list;
    for (size_t i = 0; i < items.size(); ++i) {
      leaves.emplace_back(absl::StrCat(name, "[", i, "]"), items[i]);
      if (items[i].isTensor()) list.push_back(items[i].toTensor());
    }
    split.columns = value.isTuple() ? c10::IValue(c10::ivalue::Tuple::create(std::move(items)))
                                    : c10::IValue(list);
  } else if (value.isGenericDict()) {
    c10::impl::GenericDict dict(c10::StringType::get(), c10::TensorType::get());
    for (const auto& entry : value.toGenericDict()) {
      if (!entry.key().isString()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, " is a dict whose keys are not all strings"));
      }
      leaves.emplace_back(absl::StrCat(name, "['", entry.key().toStringRef(), "']"), entry.value());
      if (entry.value().isTensor()) dict.insert(entry.key(), entry.value());
    }
    split.columns = dict;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " is a ", value.tagKind(),
                     "; give a tuple or list of tensors, a dict of named tensors, or a tensor"));
  }
  if (leaves.empty()) return absl::InvalidArgumentError(absl::StrCat(where, " holds no tensors"));
  for (size_t i = 0; i < leaves.size(); ++i) {
    const auto& [label, leaf] = leaves[i];
    if (!leaf.isTensor()) {
      return absl::InvalidArgumentError(absl::StrCat("tensors file '", path, "': ", label, " is a ",
                                                     leaf.tagKind(), ", not a tensor"));
    }
    const at::Tensor& t = leaf.toTensor();
    if (t.dim() == 0) {
      return absl::InvalidArgumentError(absl::StrCat("tensors file '", path, "': ", label,
                                                     " is a scalar; samples go along dimension 0"));
    }
    if (i == 0) {
      split.size = t.size(0);
    } else if (t.size(0) != split.size) {
      return absl::InvalidArgumentError(absl::StrCat("tensors file '", path, "': ", label, " has ",
                                                     t.size(0), " rows in dimension 0 but ",
                                                     leaves.front().first, " has ", split.size));
    }
  }
  if (split.size == 0) return absl::InvalidArgumentError(absl::StrCat(where, " has no samples"));
  return split;
}

absl::Status Dataset::LoadTensorsFile(const std::string& path) {
  if (!std::ifstream(path).good()) {
    return absl::NotFoundError(absl::StrCat("tensors file '", path, "' does not exist"));
  }
  // The older libtorch-archive format ("train/x", ...) is no longer read: it is TorchScript,
  // and loading one runs its code. ParseTorchSave refuses it naming the file.
  absl::StatusOr<c10::IValue> file = ReadTorchSaveFile(path);
  if (!file.ok()) {
    return absl::Status(file.status().code(),
                        absl::StrCat("tensors file: ", file.status().message(), kFormatHint));
  }
  if (!file->isGenericDict()) {
    return absl::InvalidArgumentError(absl::StrCat("tensors file '", path, "' holds a ",
                                                   file->tagKind(), ", not a dict of splits",
                                                   kFormatHint));
  }
  for (const auto& entry : file->toGenericDict()) {
    const std::string name = entry.key().isString() ? entry.key().toStringRef() : "";
    if (std::find(std::begin(kSplitNames), std::end(kSplitNames), name) == std::end(kSplitNames)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensors file '", path, "' has a key ",
          entry.key().isString() ? absl::StrCat("'", name, "'") : entry.key().tagKind(),
          "; its keys are the splits train, val, test and predict"));
    }
    DTRAIN_ASSIGN_OR_RETURN(Split split, CheckSplit(path, name, entry.value()));
    splits_[name] = std::move(split);
  }
  if (splits_.count("train") == 0 && splits_.count("predict") == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensors file '", path,
                     "' has no 'train' split (or 'predict', for predict only)", kFormatHint));
  }
  return absl::OkStatus();
}

void Dataset::SetRank(int rank, int world) {
  for (auto& [name, s] : streamed_) s->SetRank(rank, world);
}

int64_t Dataset::skipped() const {
  int64_t n = 0;
  for (const auto& [name, s] : streamed_) n += s->skipped();
  return n;
}

double Dataset::wait_seconds() const {
  double t = 0;
  for (const auto& [name, s] : streamed_) t += s->wait_seconds();
  return t;
}

int64_t Dataset::ReadAhead(const std::string& split) const {
  auto it = streamed_.find(split);
  return it == streamed_.end() ? 0 : it->second->window();
}

absl::StatusOr<c10::IValue> Dataset::Batch(const std::string& split,
                                           const std::vector<int64_t>& indices, int64_t epoch,
                                           std::vector<int64_t>* kept) const {
  if (kept != nullptr) kept->clear();
  if (auto s = streamed_.find(split); s != streamed_.end()) {
    DTRAIN_ASSIGN_OR_RETURN(c10::IValue batch, s->second->Batch(epoch, indices, kept));
    if (kept != nullptr && kept->size() == indices.size()) kept->clear();  // every row
    return batch;
  }
  auto it = splits_.find(split);
  if (it == splits_.end()) {
    return absl::InvalidArgumentError(absl::StrCat("the dataset has no split '", split, "'"));
  }
  if (indices.empty()) return absl::InvalidArgumentError("an index batch needs indices");
  const int64_t size = it->second.size;
  for (int64_t i : indices) {
    if (i < 0 || i >= size) {
      return absl::InvalidArgumentError(
          absl::StrCat("index ", i, " is outside split '", split, "' of ", size, " samples"));
    }
  }
  return GuardTorch("cannot make the batch", [&]() -> absl::StatusOr<c10::IValue> {
    const at::Tensor index = at::tensor(indices, at::kLong);
    c10::IValue batch = MapTensors(it->second.columns,
                                   [&](const at::Tensor& t) { return t.index_select(0, index); });
    if (fashion_normalize_) {
      batch = MapSelected(batch, "0", [](const at::Tensor& x) {
        if (x.scalar_type() != at::kByte) return x;
        std::optional<at::Tensor> scaled = NormalizedBytes(x, {static_cast<float>(kFashionMean)},
                                                           {static_cast<float>(kFashionStd)});
        return scaled ? *scaled : (x.to(at::kFloat) / 255.0 - kFashionMean) / kFashionStd;
      });
    }
    if (normalize_.has_value()) {
      const v1::Normalize& n = *normalize_;
      batch = MapSelected(batch, n.key(), [&](const at::Tensor& t) {
        if (std::optional<at::Tensor> scaled =
                NormalizedBytes(t, std::vector<float>(n.mean().begin(), n.mean().end()),
                                std::vector<float>(n.std().begin(), n.std().end()))) {
          return *scaled;
        }
        at::Tensor x = t.scalar_type() == at::kByte ? t.to(at::kFloat) / 255.0 : t;
        std::vector<int64_t> shape(std::max<int64_t>(x.dim(), 2), 1);
        shape[1] = n.mean_size();
        at::Tensor mean =
            at::tensor(std::vector<double>(n.mean().begin(), n.mean().end()), x.options())
                .view(n.mean_size() == 1 ? std::vector<int64_t>{} : shape);
        at::Tensor std =
            at::tensor(std::vector<double>(n.std().begin(), n.std().end()), x.options())
                .view(n.std_size() == 1 ? std::vector<int64_t>{} : shape);
        return (x - mean) / std;
      });
    }
    return batch;
  });
}

}  // namespace dtrain
