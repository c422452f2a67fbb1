// What the learning-rate scheduler files share (lr_schedulers, chainable_lr_schedulers,
// composite_lr_schedulers, plateau_lr_scheduler): state_dicts shaped as torch writes them
// (Python dicts and lists as IValues), a strict reader of them, Python's float modulo, and the
// checks on a SchedulerRecipe's values. Internal to worker/model.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/int_of_double.h"
#include "common/status_macros.h"
#include "google/protobuf/repeated_field.h"

namespace dtrain {
namespace lr_scheduling {

using PyDict = c10::impl::GenericDict;

inline PyDict NewDict() { return PyDict(c10::StringType::get(), c10::AnyType::get()); }

inline c10::IValue FloatList(const std::vector<double>& values) {
  c10::impl::GenericList list(c10::FloatType::get());
  for (double v : values) list.push_back(v);
  return list;
}

// Python's float % (the result has the divisor's sign), which CosineAnnealingLR relies on.
inline double PyMod(double a, double b) {
  double r = std::fmod(a, b);
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

// A number torch wrote as an int or a float; T_max and friends may be either.
inline c10::IValue Number(double v) {
  if (std::floor(v) == v && std::abs(v) < 9e15) return static_cast<int64_t>(v);
  return v;
}

class StateReader {
 public:
  StateReader(const c10::IValue& state, std::string what) : what_(std::move(what)) {
    if (state.isGenericDict()) dict_ = state.toGenericDict();
  }
  bool ok() const { return dict_.has_value(); }
  absl::Status Int(const char* key, int64_t* out) const {
    DTRAIN_ASSIGN_OR_RETURN(c10::IValue v, Get(key));
    if (v.isInt()) {
      *out = v.toInt();
    } else if (v.isDouble()) {
      const std::optional<int64_t> n = IntOfDouble(v.toDouble());
      if (!n.has_value()) return Bad(key, "a finite number within int64's range");
      *out = *n;
    } else {
      return Bad(key, "a number");
    }
    return absl::OkStatus();
  }
  absl::Status Double(const char* key, double* out) const {
    DTRAIN_ASSIGN_OR_RETURN(c10::IValue v, Get(key));
    if (v.isInt())
      *out = static_cast<double>(v.toInt());
    else if (v.isDouble())
      *out = v.toDouble();
    else
      return Bad(key, "a number");
    return absl::OkStatus();
  }
  absl::Status Doubles(const char* key, std::vector<double>* out, size_t size) const {
    DTRAIN_ASSIGN_OR_RETURN(c10::IValue v, Get(key));
    if (!v.isList()) return Bad(key, "a list");
    std::vector<double> values;
    for (const c10::IValue& e : v.toListRef()) {
      if (e.isInt())
        values.push_back(static_cast<double>(e.toInt()));
      else if (e.isDouble())
        values.push_back(e.toDouble());
      else
        return Bad(key, "a list of numbers");
    }
    if (size != 0 && values.size() != size) {
      return Bad(key, absl::StrCat("a list of ", size, " (one per param group)"));
    }
    *out = std::move(values);
    return absl::OkStatus();
  }
  absl::StatusOr<c10::IValue> Get(const char* key) const {
    auto it = dict_->find(c10::IValue(std::string(key)));
    if (it == dict_->end()) {
      return absl::InvalidArgumentError(absl::StrCat(what_, " has no '", key, "'"));
    }
    return it->value();
  }

 private:
  absl::Status Bad(const char* key, const std::string& expected) const {
    return absl::InvalidArgumentError(absl::StrCat(what_, " '", key, "' is not ", expected));
  }
  std::string what_;
  std::optional<PyDict> dict_;
};

inline absl::Status Require(bool ok, const std::string& kind, const std::string& what) {
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("configure_optimizers: ", kind, " ", what));
}

// `values` given once per group, or once for all.
inline absl::StatusOr<std::vector<double>> PerGroup(
    const google::protobuf::RepeatedField<double>& values, size_t groups, const std::string& kind,
    const std::string& name) {
  if (static_cast<size_t>(values.size()) == groups)
    return std::vector<double>(values.begin(), values.end());
  if (values.size() == 1) return std::vector<double>(groups, values[0]);
  return absl::InvalidArgumentError(absl::StrCat("configure_optimizers: ", kind, " ", name,
                                                 " needs one value or one per param group (",
                                                 groups, "), got ", values.size()));
}

}  // namespace lr_scheduling
}  // namespace dtrain
