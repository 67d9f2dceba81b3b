// SPDX-License-Identifier: Apache-2.0
#pragma once
// What fulgur knows about each optimizer type, in one table: one
// OptimizerAdapter per type (SGD, Adam, AdamW, RMSprop, Adagrad) gives its
// Python name (the LR monitor's), its hyper-parameters and per-parameter
// state in the layout Python's optimizer.state_dict() uses ({"state": {i:
// {...}}, "param_groups": [{..., "params": [i...]}]}, so a fulgur checkpoint
// is readable from Python, with only plain tensors and numbers stored), its
// state tensors (moved next to the parameters, or flushed on lazy devices),
// and its fused step if it has one. A subclass of a known type uses its
// base's adapter, except for the fused step; saving another optimizer throws
// std::invalid_argument naming its type.

#include <ATen/core/ivalue.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <memory>
#include <string>
#include <typeinfo>

namespace fulgur::detail {

struct StateReader;  // one parameter's saved state, checked as it is read (optim_state.cpp)

struct OptimizerAdapter {
  // Python's class name: "SGD", "Adam", ...
  const char* name;
  // The exact type; the other members also serve its subclasses.
  const std::type_info& type;
  // Whether `optimizer` is this type or a subclass of it.
  bool (*matches)(const torch::optim::Optimizer& optimizer);
  // The hyper-parameters of one parameter group, by Python's names, into `out`.
  void (*options)(const torch::optim::OptimizerOptions& options, c10::Dict<std::string, c10::IValue>& out);
  // One parameter's state, by Python's names (tensors on the CPU).
  c10::Dict<std::string, c10::IValue> (*save)(torch::optim::OptimizerParamState& state);
  std::unique_ptr<torch::optim::OptimizerParamState> (*load)(const StateReader& saved);
  // Replaces each defined tensor of one parameter's state by f(tensor); a
  // state of another type is left alone.
  void (*map_state)(torch::optim::OptimizerParamState& state, const std::function<at::Tensor(const at::Tensor&)>& f);
  // The fused step for the exact type (see optim/fused_adam.h); nullptr when
  // there is none. Returns false, having done nothing, when it does not apply.
  bool (*fused_step)(torch::optim::Optimizer& optimizer);
};

// The adapter serving `optimizer` (its type's, or its nearest known base's);
// nullptr for an optimizer fulgur does not know.
const OptimizerAdapter* optimizer_adapter(const torch::optim::Optimizer& optimizer);

c10::IValue optimizer_state_dict(torch::optim::Optimizer& optimizer);
// REQUIRES: `optimizer` is built over the same parameters as the saved one.
// Throws SerializationError naming `where`, the key and what was expected
// (a state of another optimizer kind, a missing key, a wrong shape), and
// leaves the optimizer unchanged then.
void load_optimizer_state_dict(torch::optim::Optimizer& optimizer, const c10::IValue& state, const std::string& where);
// The key of `p`'s entry in Optimizer::state(), as libtorch's optimizers write it.
void* optimizer_state_key(const at::Tensor& p);
// Replaces each defined tensor of `state` by f(tensor), whichever known
// optimizer's state it is (another kind is left alone).
void map_state_tensors(torch::optim::OptimizerParamState& state, const std::function<at::Tensor(const at::Tensor&)>& f);
// Moves every state tensor of `optimizer` next to its parameter.
void optimizer_state_to_params_device(torch::optim::Optimizer& optimizer);

}  // namespace fulgur::detail
