// Files in the format of Python's torch.save, read and written with libtorch alone: the user's
// data files and dtrain's Lightning-format checkpoints. Writing is torch::pickle_save's archive
// with libtorch's pickler, its TorchScript type tags off, so that torch.load reads it with
// weights_only=True (torch 2.6's default); reading is libtorch's unpickler over the zip archive
// torch.save writes.
//
// libtorch 1.13's unpickler lacks the SETITEM and APPEND opcodes, which Python's pickler emits
// for every dict or list of exactly one item (a dataset with only a train split, an optimizer
// with one parameter), so such files fail with "Unknown opcode for unpickling at 0x73". The
// pickle is rewritten first: `key value SETITEM` becomes `MARK key value SETITEMS` and
// `item APPEND` becomes `MARK item APPENDS`, which mean the same and which libtorch reads.
// A module's state_dict() is an OrderedDict carrying a `_metadata` attribute (set by BUILD),
// which libtorch cannot give a dict: that BUILD becomes POP, dropping only the attribute. This is
// the one piece of pickle handling written here; nothing in Debian reads torch.save files from C++
// otherwise.
#pragma once

#include <string>

#include <ATen/core/ivalue.h>

#include "absl/status/statusor.h"

namespace dtrain {

// NOT_FOUND: no such file. INVALID_ARGUMENT naming `path`: not a torch.save file (the legacy
// non-zip format included), or one holding Python objects libtorch cannot represent.
absl::StatusOr<c10::IValue> ReadTorchSaveFile(const std::string& path);
// The same from the file's bytes; `origin` names the file in messages.
absl::StatusOr<c10::IValue> ParseTorchSave(const std::string& bytes, const std::string& origin);

// OK when every element of `t` lies inside its storage (offset and strides non-negative, no
// overflow); INVALID_ARGUMENT saying how far it reaches. libtorch's unpickler sets a tensor's
// offset, sizes and strides unchecked: ParseTorchSave checks every tensor it reads with this.
absl::Status CheckTensorInStorage(const at::Tensor& t);

// Writes `value` so that Python's torch.load(path) reads it: atomically (a temporary file in
// the same directory, then rename). INVALID_ARGUMENT when it cannot be written.
absl::Status WriteTorchSaveFile(const std::string& path, const c10::IValue& value);

// The pickle rewrite above, exposed for tests: `pickle` with every SETITEM and APPEND turned
// into their MARK ... SETITEMS / APPENDS forms. Unchanged when it holds an opcode the rewrite does
// not know.
std::string WithoutSingleItemOpcodes(const std::string& pickle);

}  // namespace dtrain
