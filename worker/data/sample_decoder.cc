#include "worker/data/sample_decoder.h"

#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace dtrain {
namespace {

enum class Kind { kImage, kInt, kFloat, kNpy, kJson, kTorch, kText, kBytes };

absl::StatusOr<Kind> KindFromName(const std::string& name) {
  static const std::pair<const char*, Kind> kNames[] = {
      {"image", Kind::kImage}, {"int", Kind::kInt},     {"float", Kind::kFloat},
      {"npy", Kind::kNpy},     {"json", Kind::kJson},   {"torch", Kind::kTorch},
      {"text", Kind::kText},   {"bytes", Kind::kBytes}};
  for (const auto& [n, k] : kNames) {
    if (name == n) return k;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown field type '", name, "'; use image, int, float, npy, json, torch, text or bytes"));
}

Kind KindFromExtension(const std::string& ext) {
  const std::string last = ext.substr(ext.rfind('.') + 1);
  if (last == "jpg" || last == "jpeg" || last == "png" || last == "webp") return Kind::kImage;
  if (last == "cls" || last == "cls2" || last == "index" || last == "idx" || last == "id") {
    return Kind::kInt;
  }
  if (last == "npy") return Kind::kNpy;
  if (last == "json") return Kind::kJson;
  if (last == "pt" || last == "pth") return Kind::kTorch;
  if (last == "txt" || last == "text") return Kind::kText;
  return Kind::kBytes;
}

struct Field {
  std::vector<std::string> names;  // extensions, the first present wins
  Kind kind;
};

absl::StatusOr<at::Tensor> Decode(const std::string& bytes, Kind kind) {
  switch (kind) {
    case Kind::kInt: {
      int64_t v = 0;
      if (bytes.size() > 64 || !absl::SimpleAtoi(bytes, &v)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "an int field holds '", absl::CEscape(bytes.substr(0, 32)), "', not a whole number"));
      }
      return at::scalar_tensor(v, at::kLong);
    }
    case Kind::kFloat: {
      double v = 0;
      if (bytes.size() > 64 || !absl::SimpleAtod(bytes, &v)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "a float field holds '", absl::CEscape(bytes.substr(0, 32)), "', not a number"));
      }
      return at::scalar_tensor(v, at::kFloat);
    }
    case Kind::kText:
    case Kind::kBytes: {
      at::Tensor t = at::empty({static_cast<int64_t>(bytes.size())}, at::kByte);
      if (!bytes.empty()) std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
      return t;
    }
    default:
      return absl::UnimplementedError("this field type is not decoded yet");
  }
}

}  // namespace

absl::StatusOr<SampleDecoder> MakeSampleDecoder(
    const google::protobuf::RepeatedPtrField<v1::ShardField>& fields, const v1::DataConfig& data,
    uint64_t seed, bool training) {
  if (fields.empty()) {
    return absl::InvalidArgumentError(
        "shards.fields: name the fields that make a batch, e.g. [{name: jpg, type: image}, "
        "{name: cls, type: int}]");
  }
  std::vector<Field> plan;
  for (int i = 0; i < fields.size(); ++i) {
    const std::string at = absl::StrCat("shards.fields[", i, "]");
    Field f;
    for (absl::string_view n : absl::StrSplit(fields[i].name(), ';', absl::SkipWhitespace())) {
      f.names.push_back(absl::AsciiStrToLower(absl::StripAsciiWhitespace(n)));
    }
    if (f.names.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(at, ".name: give the field's extension in the shards (jpg, cls, ...)"));
    }
    if (fields[i].type().empty()) {
      f.kind = KindFromExtension(f.names.front());
    } else {
      absl::StatusOr<Kind> kind = KindFromName(fields[i].type());
      if (!kind.ok()) return absl::InvalidArgumentError(absl::StrCat(at, ".type: ", kind.status().message()));
      f.kind = *kind;
    }
    plan.push_back(std::move(f));
  }
  (void)data;
  (void)seed;
  (void)training;
  return SampleDecoder([plan](const ShardSample& sample,
                              int64_t epoch) -> absl::StatusOr<std::vector<at::Tensor>> {
    std::vector<at::Tensor> out;
    out.reserve(plan.size());
    for (const Field& f : plan) {
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
      absl::StatusOr<at::Tensor> t = Decode(*bytes, f.kind);
      if (!t.ok()) {
        return absl::Status(t.status().code(),
                            absl::StrCat("field ", f.names.front(), ": ", t.status().message()));
      }
      out.push_back(std::move(*t));
    }
    return out;
  });
}

}  // namespace dtrain
