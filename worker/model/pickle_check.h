// A check of a pickle before libtorch's unpickler reads it. libtorch 1.13's unpickler trusts its
// input: it does not check the stack on each opcode, sizes its memo by whatever index a PUT
// names, and a deeply nested value overflows the C++ stack where it is built and destroyed. So a
// torch.save file's data.pkl (after the rewrite in torch_save_file.cc) is walked here first, the
// way an unpickler would, without building anything: every opcode is one of pickle protocol 2's
// (torch.save's default) with its arguments inside the input, every pop finds its items above
// the current mark, memo indices are ones the pickle defined (PUT indices at most one past the
// count so far), nesting is bounded, and STOP leaves exactly one value. Plain C++, fuzzed by
// tests/fuzz/pickle_check_fuzzer.cc.
//
// It is also where "data is never code" is enforced: a GLOBAL may name only what libtorch builds
// as plain data (IsConstructedGlobal), and REDUCE may only call such a GLOBAL. Python objects
// of other classes never get this far: torch_save_file.cc's rewrite turns them into inert
// lists first.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace dtrain {

// Containers nested deeper than this are refused (Lightning checkpoints nest about ten).
inline constexpr int kMaxPickleDepth = 100;

// A storage the pickle names by torch.save's persistent id.
struct PickledStorage {
  std::string key;   // its record: data/<key>
  std::string type;  // "torch.FloatStorage", ...
  uint64_t numel = 0;
};

// Whether libtorch's unpickler may build the global `module`.`name` from a data file or a
// checkpoint: a tensor (torch._utils._rebuild_tensor_v2), a storage type (torch.<Type>Storage),
// torch.device, an OrderedDict (which libtorch makes None of), and the list-type tags libtorch's
// own pickler writes (torch.jit._pickle.build_*list, restore_type_tag). Nothing else: no
// __torch__ class (TorchScript objects run __setstate__), no rref, no sparse or quantized
// rebuild, no builtins.
bool IsConstructedGlobal(absl::string_view module, absl::string_view name);

// OK when `pickle` is well formed as above; INVALID_ARGUMENT naming the byte offset, the opcode
// and what is wrong ("at byte 17, APPENDS: no MARK to pop to"). Every persistent id must be
// torch.save's storage id; with `storages`, they are listed there.
absl::Status CheckPickle(absl::string_view pickle, int max_depth = kMaxPickleDepth,
                         std::vector<PickledStorage>* storages = nullptr);

}  // namespace dtrain
