#pragma once
// State dicts, and reading checkpoints outside a Trainer.

#include <fulgur/lightning_module.h>

#include <string>
#include <vector>

namespace fulgur {

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
