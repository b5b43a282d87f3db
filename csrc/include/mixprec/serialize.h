// Files that Python's torch.load reads, from C++.
//
// torch::pickle_save writes the torch.save format, but tags every dict and
// list with a TorchScript type (torch.jit._pickle.restore_type_tag), which
// torch.load(..., weights_only=True) -- the default since torch 2.6 --
// refuses. These write the same format without the tags, so a state dict
// saved from C++ is a plain checkpoint for Python.
#pragma once

#include "mixprec/export.h"

#include <ATen/core/ivalue.h>

#include <string>
#include <vector>

namespace mixprec {

// The bytes of a torch.save file holding `value`: nested dicts (str keys),
// lists, tuples, str, int, float, bool, None and tensors (saved from the CPU;
// other devices are copied). Python: torch.load(f, weights_only=True).
MIXPREC_API std::vector<char> pickle_save(const c10::IValue& value);

// pickle_save(value) written to `path` (c10::Error when that fails). POSIX:
// atomically -- written beside it, fsync-ed and renamed onto it, so `path`
// holds the previous file or the new one whenever the process dies.
MIXPREC_API void torch_save(const c10::IValue& value, const std::string& path);

// Reads a file written by torch_save, torch::pickle_save or Python's
// torch.save (tensors, containers and primitive values).
MIXPREC_API c10::IValue torch_load(const std::string& path);

}  // namespace mixprec
