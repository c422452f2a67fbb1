#include "common/torch_save_writer.h"

#include <archive.h>
#include <archive_entry.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"

namespace dtrain {
namespace {

// The archive's folder, as torch.save names it after the file; torch.load takes whatever the
// first record's folder is.
constexpr char kFolder[] = "archive/";
// Deeper trees are refused: predictions are a list of dicts of tensors.
constexpr int kMaxDepth = 32;

const char* StorageClass(DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT32:
      return "FloatStorage";
    case v1::DTYPE_FLOAT64:
      return "DoubleStorage";
    case v1::DTYPE_FLOAT16:
      return "HalfStorage";
    case v1::DTYPE_BFLOAT16:
      return "BFloat16Storage";
    case v1::DTYPE_INT8:
      return "CharStorage";
    case v1::DTYPE_UINT8:
      return "ByteStorage";
    case v1::DTYPE_INT32:
      return "IntStorage";
    case v1::DTYPE_INT64:
      return "LongStorage";
    case v1::DTYPE_BOOL:
      return "BoolStorage";
    default:
      return nullptr;
  }
}

// Pickle protocol 2, the opcodes torch.save's pickler emits for these values.
class Pickler {
 public:
  std::string Take() { return std::move(out_); }
  void Begin() { out_ += "\x80\x02"; }
  void End() { out_ += '.'; }

  absl::Status Value(const PickleValue& v, int depth) {
    if (depth > kMaxDepth) {
      return absl::InvalidArgumentError(
          absl::StrCat("values nested deeper than ", kMaxDepth, " cannot be saved"));
    }
    switch (v.kind) {
      case PickleValue::Kind::kNone:
        out_ += 'N';
        return absl::OkStatus();
      case PickleValue::Kind::kInt:
        Int(v.number);
        return absl::OkStatus();
      case PickleValue::Kind::kString:
        String(v.text);
        return absl::OkStatus();
      case PickleValue::Kind::kTensor:
        return Tensor(v);
      case PickleValue::Kind::kList:
        out_ += ']';
        return Items(v, depth, 'e');
      case PickleValue::Kind::kTuple:
        out_ += '(';
        for (const auto& item : v.items) {
          if (absl::Status s = Value(item.second, depth + 1); !s.ok()) return s;
        }
        out_ += 't';
        return absl::OkStatus();
      case PickleValue::Kind::kDict:
        out_ += '}';
        return Items(v, depth, 'u');
    }
    return absl::InvalidArgumentError("unknown value kind");
  }

 private:
  // A list's APPENDS or a dict's SETITEMS, after its empty container.
  absl::Status Items(const PickleValue& v, int depth, char op) {
    if (v.items.empty()) return absl::OkStatus();
    out_ += '(';
    for (const auto& [key, value] : v.items) {
      if (op == 'u') String(key);
      if (absl::Status s = Value(value, depth + 1); !s.ok()) return s;
    }
    out_ += op;
    return absl::OkStatus();
  }

  void Int(int64_t n) {
    if (n >= INT32_MIN && n <= INT32_MAX) {
      out_ += 'J';
      Little(static_cast<uint32_t>(static_cast<int32_t>(n)), 4);
      return;
    }
    out_ += '\x8a';  // LONG1: 8 little-endian two's-complement bytes
    out_ += '\x08';
    Little(static_cast<uint64_t>(n), 8);
  }

  void String(const std::string& s) {
    out_ += 'X';  // BINUNICODE
    Little(s.size(), 4);
    out_ += s;
  }

  void Global(const char* module, const char* name) {
    absl::StrAppend(&out_, "c", module, "\n", name, "\n");
  }

  // torch._utils._rebuild_tensor_v2(storage, 0, size, stride, False, OrderedDict()), with the
  // storage as the persistent id ('storage', torch.<Type>Storage, key, 'cpu', numel).
  absl::Status Tensor(const PickleValue& v) {
    const char* storage = StorageClass(v.dtype);
    if (storage == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("no torch storage for dtype ", v1::DType_Name(v.dtype)));
    }
    // AddTensor checked the shape: ValidateMeta bounds every partial product.
    int64_t numel = 1;
    for (int64_t d : v.shape) numel *= d;
    Global("torch._utils", "_rebuild_tensor_v2");
    out_ += '(';
    out_ += '(';
    String("storage");
    Global("torch", storage);
    String(absl::StrCat(v.number));
    String("cpu");
    Int(numel);
    out_ += 't';
    out_ += 'Q';  // BINPERSID
    Int(0);
    out_ += '(';
    for (int64_t d : v.shape) Int(d);
    out_ += 't';
    out_ += '(';
    for (int64_t s : v.strides) Int(s);
    out_ += 't';
    out_ += '\x89';  // NEWFALSE: requires_grad
    Global("collections", "OrderedDict");
    out_ += ')';  // EMPTY_TUPLE
    out_ += 'R';
    out_ += 't';
    out_ += 'R';
    return absl::OkStatus();
  }

  void Little(uint64_t value, int bytes) {
    for (int i = 0; i < bytes; ++i) out_ += static_cast<char>((value >> (8 * i)) & 0xff);
  }

  std::string out_;
};

// The pickle torch.load reads for `root`, tensors by their storage keys.
absl::StatusOr<std::string> PickleOf(const PickleValue& root) {
  Pickler p;
  p.Begin();
  if (absl::Status s = p.Value(root, 0); !s.ok()) return s;
  p.End();
  return p.Take();
}

}  // namespace

PickleValue PickleValue::Int(int64_t n) {
  PickleValue v;
  v.kind = Kind::kInt;
  v.number = n;
  return v;
}

PickleValue PickleValue::String(std::string s) {
  PickleValue v;
  v.kind = Kind::kString;
  v.text = std::move(s);
  return v;
}

PickleValue PickleValue::List(std::vector<PickleValue> items) {
  PickleValue v;
  v.kind = Kind::kList;
  for (PickleValue& item : items) v.items.emplace_back("", std::move(item));
  return v;
}

PickleValue PickleValue::Tuple(std::vector<PickleValue> items) {
  PickleValue v = List(std::move(items));
  v.kind = Kind::kTuple;
  return v;
}

PickleValue PickleValue::Dict(std::vector<std::pair<std::string, PickleValue>> items) {
  PickleValue v;
  v.kind = Kind::kDict;
  v.items = std::move(items);
  return v;
}

absl::StatusOr<std::unique_ptr<TorchSaveWriter>> TorchSaveWriter::Create(const std::string& path) {
  struct archive* a = archive_write_new();
  if (a == nullptr) return absl::ResourceExhaustedError("libarchive: out of memory");
  if (archive_write_set_format_zip(a) != ARCHIVE_OK ||
      archive_write_set_options(a, "zip:compression=store") != ARCHIVE_OK ||
      archive_write_open_filename(a, path.c_str()) != ARCHIVE_OK) {
    const std::string message =
        absl::StrCat("cannot write '", path, "': ", archive_error_string(a));
    archive_write_free(a);
    return absl::FailedPreconditionError(message);
  }
  return std::unique_ptr<TorchSaveWriter>(new TorchSaveWriter(path, a));
}

TorchSaveWriter::~TorchSaveWriter() {
  if (archive_ != nullptr) archive_write_free(archive_);
}

absl::Status TorchSaveWriter::AddRecord(const std::string& name, const std::string& bytes) {
  if (finished_) return absl::FailedPreconditionError("the file is already finished");
  struct archive_entry* entry = archive_entry_new();
  if (entry == nullptr) return absl::ResourceExhaustedError("libarchive: out of memory");
  archive_entry_set_pathname(entry, absl::StrCat(kFolder, name).c_str());
  archive_entry_set_filetype(entry, AE_IFREG);
  archive_entry_set_perm(entry, 0644);
  archive_entry_set_size(entry, static_cast<la_int64_t>(bytes.size()));
  const bool ok = archive_write_header(archive_, entry) == ARCHIVE_OK &&
                  (bytes.empty() || archive_write_data(archive_, bytes.data(), bytes.size()) ==
                                        static_cast<la_ssize_t>(bytes.size()));
  archive_entry_free(entry);
  if (!ok) {
    return absl::DataLossError(
        absl::StrCat("cannot write '", path_, "': ", archive_error_string(archive_)));
  }
  return absl::OkStatus();
}

absl::StatusOr<PickleValue> TorchSaveWriter::AddTensor(const HostTensor& tensor) {
  if (StorageClass(tensor.dtype) == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("no torch storage for dtype ", v1::DType_Name(tensor.dtype)));
  }
  v1::TensorMeta meta;
  meta.set_dtype(tensor.dtype);
  for (int64_t d : tensor.shape) meta.add_shape(d);
  absl::StatusOr<int64_t> bytes = ValidateMeta(meta);
  if (!bytes.ok()) return bytes.status();
  if (static_cast<int64_t>(tensor.data.size()) != *bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a tensor of ", *bytes, " bytes holds ", tensor.data.size()));
  }
  // Contiguous strides as torch computes them: a zero-size dimension counts as 1.
  std::vector<int64_t> strides(tensor.shape.size());
  int64_t stride = 1;
  for (size_t i = tensor.shape.size(); i-- > 0;) {
    strides[i] = stride;
    const int64_t d = std::max<int64_t>(tensor.shape[i], 1);
    if (stride > std::numeric_limits<int64_t>::max() / d) {
      return absl::InvalidArgumentError("a tensor's strides overflow int64");
    }
    stride *= d;
  }
  PickleValue v;
  v.kind = PickleValue::Kind::kTensor;
  v.number = storages_++;
  v.dtype = tensor.dtype;
  v.shape = tensor.shape;
  v.strides = std::move(strides);
  if (absl::Status s = AddRecord(absl::StrCat("data/", v.number), tensor.data); !s.ok()) return s;
  return v;
}

absl::Status TorchSaveWriter::Finish(const PickleValue& root) {
  if (finished_) return absl::FailedPreconditionError("the file is already finished");
  absl::StatusOr<std::string> pickle = PickleOf(root);
  absl::Status status = pickle.status();
  if (status.ok()) status = AddRecord("data.pkl", *pickle);
  if (status.ok()) status = AddRecord("byteorder", "little");
  if (status.ok()) status = AddRecord("version", "3\n");
  finished_ = true;
  if (archive_write_close(archive_) != ARCHIVE_OK && status.ok()) {
    status = absl::DataLossError(
        absl::StrCat("cannot write '", path_, "': ", archive_error_string(archive_)));
  }
  archive_write_free(archive_);
  archive_ = nullptr;
  return status;
}

}  // namespace dtrain
