// SPDX-License-Identifier: Apache-2.0
#include <fulgur/checkpoint.h>
#include <fulgur/plugins/io/checkpoint_io.h>

#include <torch/nn/module.h>
#include <torch/torch.h>

#include <set>
#include <stdexcept>

namespace fulgur {

namespace {

// A CPU tensor that shares no storage with `t` (to(kCPU) alone returns a CPU tensor itself).
at::Tensor cpu_copy(const at::Tensor& t) {
  return t.device().is_cpu() ? t.detach().clone() : t.detach().to(torch::kCPU);
}

}  // namespace

c10::Dict<std::string, c10::IValue> state_dict(const torch::nn::Module& module) {
  auto out = fulgur::make_dict();
  for (const auto& p : module.named_parameters(true)) out.insert(p.key(), cpu_copy(p.value()));
  for (const auto& b : module.named_buffers(true)) out.insert(b.key(), cpu_copy(b.value()));
  return out;
}

std::vector<std::string> load_state_dict(torch::nn::Module& module, const c10::Dict<std::string, c10::IValue>& state,
                                         bool strict, const std::string& source) {
  torch::NoGradGuard no_grad;
  std::vector<std::string> warnings;
  std::set<std::string> used;
  auto load = [&](const std::string& name, at::Tensor& target) {
    if (!state.contains(name)) {
      const std::string msg = source + ": missing key '" + name + "' (the module has it, the checkpoint does not)";
      if (strict) throw std::runtime_error(msg);
      warnings.push_back(msg);
      return;
    }
    used.insert(name);
    const c10::IValue& v = state.at(name);
    if (!v.isTensor()) throw std::runtime_error(source + ": key '" + name + "' holds a " + v.tagKind() + ", not a tensor");
    const at::Tensor t = v.toTensor();
    if (t.sizes() != target.sizes()) {
      throw std::runtime_error(source + ": key '" + name + "' has shape " + c10::str(t.sizes()) +
                               " in the checkpoint but " + c10::str(target.sizes()) + " in the module");
    }
    target.copy_(t.to(target.device(), target.scalar_type()));
  };
  for (auto& p : module.named_parameters(true)) load(p.key(), p.value());
  for (auto& b : module.named_buffers(true)) load(b.key(), b.value());
  for (const auto& kv : state) {
    if (used.count(kv.key())) continue;
    const std::string msg = source + ": unexpected key '" + kv.key() + "' (the checkpoint has it, the module does not)";
    if (strict) throw std::runtime_error(msg);
    warnings.push_back(msg);
  }
  return warnings;
}

std::vector<std::string> load_from_checkpoint(torch::nn::Module& module, const std::string& path, bool strict) {
  TorchCheckpointIO io;
  Checkpoint ckpt = io.load_checkpoint(path);
  if (ckpt.contains("state_dict")) {
    const c10::IValue sd = ckpt.at("state_dict");
    if (!sd.isGenericDict()) throw std::runtime_error("checkpoint " + path + ": 'state_dict' is not a dict");
    return load_state_dict(module, c10::impl::toTypedDict<std::string, c10::IValue>(sd.toGenericDict()), strict,
                           "checkpoint " + path);
  }
  return load_state_dict(module, ckpt, strict, "checkpoint " + path);
}

}  // namespace fulgur
