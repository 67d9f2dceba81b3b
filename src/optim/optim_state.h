#pragma once
// Optimizer and scheduler state in the layout Python's optimizer.state_dict()
// uses ({"state": {i: {...}}, "param_groups": [{..., "params": [i...]}]}), so a
// fulgur checkpoint is readable from Python, and only plain tensors and
// numbers are stored. SGD, Adam, AdamW, RMSprop and Adagrad (and their
// subclasses) are known; saving another optimizer throws std::invalid_argument
// naming its type.

#include <ATen/core/ivalue.h>
#include <torch/optim/optimizer.h>

#include <string>

namespace fulgur::detail {

c10::IValue optimizer_state_dict(torch::optim::Optimizer& optimizer);
// REQUIRES: `optimizer` is built over the same parameters as the saved one.
// Throws SerializationError naming `where`, the key and what was expected
// (a state of another optimizer kind, a missing key, a wrong shape), and
// leaves the optimizer unchanged then.
void load_optimizer_state_dict(torch::optim::Optimizer& optimizer, const c10::IValue& state, const std::string& where);
// The key of `p`'s entry in Optimizer::state(), as libtorch's optimizers write it.
std::string optimizer_state_key(const at::Tensor& p);
// Moves every state tensor of `optimizer` next to its parameter.
void optimizer_state_to_params_device(torch::optim::Optimizer& optimizer);

}  // namespace fulgur::detail
