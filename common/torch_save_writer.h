// TorchSaveWriter: a file Python's torch.load reads, in torch.save's format (a zip archive
// holding a protocol-2 pickle and one record per tensor storage), written without libtorch, so
// that the coordinator can write predictions.pt. Tensors go into the archive as they are added;
// only the small tree of what the pickle holds is kept until Finish. The zip is libarchive's
// (stored, not deflated, as torch.save stores it); the pickle is written here, since no library
// on the coordinator's side writes one, and it uses only what torch.load's weights_only
// unpickler allows (_rebuild_tensor_v2, typed storages, OrderedDict).
//
// Thread-safety: none.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/tensor.h"

struct archive;  // libarchive's, kept out of this header

namespace dtrain {

// A value of what torch.load returns: None, an int, a str, a tensor already written to the
// archive, or a list, tuple or dict (str keys) of values.
struct PickleValue {
  enum class Kind { kNone, kInt, kString, kTensor, kList, kTuple, kDict };
  Kind kind = Kind::kNone;
  int64_t number = 0;
  std::string text;
  // kTensor: its storage record's key (in `number`), dtype, shape and contiguous strides.
  DType dtype = v1::DTYPE_UNSPECIFIED;
  std::vector<int64_t> shape = {};
  std::vector<int64_t> strides = {};
  // kList and kTuple: the items (their keys empty); kDict: key and value, in order.
  std::vector<std::pair<std::string, PickleValue>> items = {};

  static PickleValue Int(int64_t n);
  static PickleValue String(std::string s);
  static PickleValue List(std::vector<PickleValue> items);
  static PickleValue Tuple(std::vector<PickleValue> items);
  static PickleValue Dict(std::vector<std::pair<std::string, PickleValue>> items);
};

class TorchSaveWriter {
 public:
  // Creates (truncates) `path`.
  static absl::StatusOr<std::unique_ptr<TorchSaveWriter>> Create(const std::string& path);
  ~TorchSaveWriter();
  TorchSaveWriter(const TorchSaveWriter&) = delete;
  TorchSaveWriter& operator=(const TorchSaveWriter&) = delete;

  // Writes `tensor`'s storage now; the value refers to it. INVALID_ARGUMENT for a dtype
  // torch.load has no storage for, a shape ValidateMeta refuses or whose strides overflow, or
  // data that does not match the shape.
  absl::StatusOr<PickleValue> AddTensor(const HostTensor& tensor);

  // Writes the pickle of `root` and the archive's version and byteorder records, and closes
  // the file. The writer is done after it, whatever it answers.
  absl::Status Finish(const PickleValue& root);

 private:
  TorchSaveWriter(std::string path, ::archive* archive)
      : path_(std::move(path)), archive_(archive) {}
  absl::Status AddRecord(const std::string& name, const std::string& bytes);

  const std::string path_;
  ::archive* archive_;
  int64_t storages_ = 0;
  bool finished_ = false;
};

}  // namespace dtrain
