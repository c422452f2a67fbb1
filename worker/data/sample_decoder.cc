#include "worker/data/sample_decoder.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "worker/data/image_transforms.h"
#include "worker/data/sample_fields.h"
#include "worker/data/script_transform.h"

namespace dtrain {
namespace {

struct BatchField {
  std::vector<std::string> names;  // extensions, the first present wins
  FieldType type;
  int channels = 3;  // images: RGB, or 1 for "L"
};

}  // namespace

absl::StatusOr<SampleDecoder> MakeSampleDecoder(
    const google::protobuf::RepeatedPtrField<v1::ShardField>& fields, const v1::DataConfig& data,
    uint64_t seed, bool training) {
  if (fields.empty()) {
    return absl::InvalidArgumentError(
        "shards.fields: name the fields that make a batch, e.g. [{name: jpg, type: image}, "
        "{name: cls, type: int}]");
  }
  std::vector<BatchField> plan;
  for (int i = 0; i < fields.size(); ++i) {
    const std::string at = absl::StrCat("shards.fields[", i, "]");
    BatchField f;
    for (absl::string_view n : absl::StrSplit(fields[i].name(), ';', absl::SkipWhitespace())) {
      f.names.push_back(absl::AsciiStrToLower(absl::StripAsciiWhitespace(n)));
    }
    if (f.names.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(at, ".name: give the field's extension in the shards (jpg, cls, ...)"));
    }
    if (fields[i].type().empty()) {
      f.type = DefaultFieldType(f.names.front());
    } else {
      absl::StatusOr<FieldType> type = FieldTypeFromName(fields[i].type());
      if (!type.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(at, ".type: ", type.status().message()));
      }
      f.type = *type;
    }
    const std::string& mode = fields[i].image_mode();
    if (!mode.empty() && mode != "RGB" && mode != "L") {
      return absl::InvalidArgumentError(
          absl::StrCat(at, ".image_mode: unknown image mode '", mode, "'; use RGB or L"));
    }
    f.channels = mode == "L" ? 1 : 3;
    plan.push_back(std::move(f));
  }
  // Training's transforms for the train split, eval's for the others (torchvision's usual
  // pair of Compose lists). Built once, validated here, shared by the decoding threads.
  const std::string where = training ? "transforms.train" : "transforms.eval";
  absl::StatusOr<ImageTransformPipeline> made = ImageTransformPipeline::Create(
      training ? data.transforms().train() : data.transforms().eval(), where);
  if (!made.ok()) return made.status();
  auto pipeline = std::make_shared<const ImageTransformPipeline>(std::move(*made));
  std::shared_ptr<const ScriptTransform> script;
  if (!data.transforms().script().empty()) {
    absl::StatusOr<std::shared_ptr<const ScriptTransform>> loaded =
        ScriptTransform::Load(data.transforms().script(), training);
    if (!loaded.ok()) return loaded.status();
    script = std::move(*loaded);
  }
  return SampleDecoder([plan, pipeline, script, seed](
                           const ShardSample& sample, int64_t epoch,
                           const FieldOutput& output) -> absl::StatusOr<std::vector<at::Tensor>> {
    std::vector<at::Tensor> out;
    out.reserve(plan.size());
    for (size_t i = 0; i < plan.size(); ++i) {
      const BatchField& f = plan[i];
      const std::string* bytes = nullptr;
      for (const std::string& n : f.names) {
        auto it = sample.fields.find(n);
        if (it != sample.fields.end()) {
          bytes = &it->second;
          break;
        }
      }
      if (bytes == nullptr) {
        std::vector<std::string> has;
        for (const auto& [name, b] : sample.fields) has.push_back(name);
        return absl::InvalidArgumentError(absl::StrCat("no field ", absl::StrJoin(f.names, " or "),
                                                       " (it has ", absl::StrJoin(has, ", "), ")"));
      }
      absl::StatusOr<at::Tensor> t;
      if (f.type == FieldType::kImage) {
        // Every image field of a sample draws the same random parameters (an image and its
        // mask get the same crop), from (seed, epoch, key): a resumed job sees the same ones.
        SampleRandom rng(SampleSeed(seed, epoch, sample.key));
        ImageDecodeOptions options;
        options.channels = f.channels;
        // Straight into the batch's row, unless a script transform still changes it.
        ImageOutput into;
        if (script == nullptr && output) {
          into = [&](at::IntArrayRef sizes) { return output(i, sizes, at::kFloat); };
        }
        t = pipeline->DecodeAndApply(*bytes, options, rng, into);
      } else if ((f.type == FieldType::kInt || f.type == FieldType::kFloat) && script == nullptr &&
                 output) {
        // A label straight into the batch's row: no tensor of its own, no copy.
        at::Tensor row = output(i, {}, f.type == FieldType::kInt ? at::kLong : at::kFloat);
        if (row.defined()) {
          absl::Status written = DecodeScalarFieldInto(*bytes, f.type, row);
          t = written.ok() ? absl::StatusOr<at::Tensor>(row) : written;
        } else {
          t = DecodeField(*bytes, f.type);
        }
      } else {
        t = DecodeField(*bytes, f.type);
      }
      if (!t.ok()) {
        return absl::Status(t.status().code(),
                            absl::StrCat("field ", f.names.front(), ": ", t.status().message()));
      }
      out.push_back(std::move(*t));
    }
    if (script != nullptr)
      return script->Apply(std::move(out), SampleSeed(seed, epoch, sample.key));
    return out;
  });
}

}  // namespace dtrain
