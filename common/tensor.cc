#include "common/tensor.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace dtrain {

int64_t HostTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<HostTensor> HostTensor::Zeros(DType dtype, std::vector<int64_t> shape) {
  HostTensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  DTRAIN_ASSIGN_OR_RETURN(int64_t bytes, ValidateMeta(MetaOf(t)));
  t.data.assign(static_cast<size_t>(bytes), '\0');
  return t;
}

absl::StatusOr<int64_t> ValidateMeta(const v1::TensorMeta& meta, int64_t max_bytes) {
  DTRAIN_ASSIGN_OR_RETURN(int64_t element_size, DTypeSize(meta.dtype()));
  int64_t numel = 1;
  for (int i = 0; i < meta.shape_size(); ++i) {
    const int64_t d = meta.shape(i);
    if (d < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor shape ", DescribeMeta(meta), " has a negative dimension ", d, " at index ", i));
    }
    if (d != 0 && numel > std::numeric_limits<int64_t>::max() / element_size / d) {
      return absl::InvalidArgumentError(absl::StrCat("tensor shape ", DescribeMeta(meta),
                                                     " has more elements than 64 bits can count"));
    }
    numel *= d;
  }
  const int64_t bytes = numel * element_size;
  if (bytes > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", DescribeMeta(meta), " needs ", bytes,
                                                   " bytes; the limit is ", max_bytes));
  }
  return bytes;
}

absl::Status ValidatePayload(const v1::TensorMeta& meta, int64_t data_bytes, int64_t max_bytes) {
  DTRAIN_ASSIGN_OR_RETURN(int64_t expected, ValidateMeta(meta, max_bytes));
  if (expected != data_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", DescribeMeta(meta), " needs ",
                                                   expected, " bytes of data but ", data_bytes,
                                                   " were sent"));
  }
  return absl::OkStatus();
}

std::string DescribeMeta(const v1::TensorMeta& meta) {
  return absl::StrCat(DTypeName(meta.dtype()), "[", absl::StrJoin(meta.shape(), ", "), "]");
}

v1::TensorMeta MetaOf(const HostTensor& tensor) {
  v1::TensorMeta meta;
  meta.set_dtype(tensor.dtype);
  for (int64_t d : tensor.shape) meta.add_shape(d);
  return meta;
}

std::vector<int64_t> ShapeOf(const v1::TensorMeta& meta) {
  return std::vector<int64_t>(meta.shape().begin(), meta.shape().end());
}

absl::StatusOr<HostTensor> FromProto(const v1::Tensor& proto) {
  DTRAIN_RETURN_IF_ERROR(ValidatePayload(proto.meta(), static_cast<int64_t>(proto.data().size())));
  HostTensor t;
  t.dtype = proto.meta().dtype();
  t.shape = ShapeOf(proto.meta());
  t.data = proto.data();
  return t;
}

void ToProto(const HostTensor& tensor, v1::Tensor* proto) {
  *proto->mutable_meta() = MetaOf(tensor);
  proto->set_data(tensor.data);
}

}  // namespace dtrain
