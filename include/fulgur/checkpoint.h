// SPDX-License-Identifier: Apache-2.0
#pragma once
// The checkpoint dict, state dicts, and reading checkpoints outside a Trainer.

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>

#include <string>
#include <vector>

namespace torch::nn {
class Module;
}  // namespace torch::nn

namespace fulgur {

// A checkpoint: Lightning's dict layout (see docs/ARCHITECTURE.md, "Checkpoint format").
using Checkpoint = c10::Dict<std::string, c10::IValue>;

// An empty dict of string keys and any values (c10::Dict<std::string,
// c10::IValue> has no default constructor).
inline c10::Dict<std::string, c10::IValue> make_dict() {
  return c10::impl::toTypedDict<std::string, c10::IValue>(
      c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get()));
}

// Copies `state` into the module's parameters and buffers (by their dotted
// names, as torch.nn names them). With strict, a missing or unexpected key or
// a shape mismatch throws std::runtime_error naming `source` and the key;
// without, matching entries are loaded and the others are returned as
// warnings (shape mismatches always throw).
std::vector<std::string> load_state_dict(torch::nn::Module& module, const c10::Dict<std::string, c10::IValue>& state,
                                         bool strict = true, const std::string& source = "state_dict");

// A copy of the module's parameters and buffers by dotted name, as CPU
// tensors that share no storage with the module (changing one leaves the
// module alone).
c10::Dict<std::string, c10::IValue> state_dict(const torch::nn::Module& module);

// Loads checkpoint["state_dict"] of the file at `path` (a fulgur checkpoint or
// a bare state_dict saved by Python's torch.save) into `module`.
std::vector<std::string> load_from_checkpoint(torch::nn::Module& module, const std::string& path, bool strict = true);

}  // namespace fulgur
