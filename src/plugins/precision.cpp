#include <fulgur/plugins/precision/precision.h>

#include "optim/fused_adam.h"

#include <torch/torch.h>

#include <stdexcept>

namespace fulgur {

std::string validate_precision(const std::string& name) {
  if (name == "32-true" || name == "32" || name == "bf16-true") return name == "32" ? "32-true" : name;
  std::string why;
  if (name == "16-true" || name == "16-mixed" || name == "16") {
    why = " (half precision has no matmul kernels on the CPU in libtorch 1.13; use bf16-true)";
  }
  throw std::invalid_argument("precision '" + name + "' is not supported; valid: \"32-true\", \"bf16-true\"" + why);
}

Precision::Precision(std::string name) : name_(validate_precision(name)) {}

c10::ScalarType Precision::dtype() const { return name_ == "bf16-true" ? torch::kBFloat16 : torch::kFloat32; }

void Precision::convert_module(torch::nn::Module& module) const {
  if (dtype() == torch::kFloat32) return;
  module.to(dtype());
}

Batch Precision::convert_input(const Batch& batch) const {
  if (dtype() == torch::kFloat32) return batch;
  auto convert = [&](const at::Tensor& t) {
    return t.defined() && t.is_floating_point() ? t.to(dtype()) : t;
  };
  return {convert(batch.data), convert(batch.target)};
}

void Precision::optimizer_step(torch::optim::Optimizer& optimizer, const std::function<void()>& closure,
                               const StepHooks& hooks) const {
  if (closure) closure();
  if (hooks.before_step) hooks.before_step();
  if (!detail::fused_optimizer_step(optimizer)) optimizer.step();
  if (hooks.after_step) hooks.after_step();
}

}  // namespace fulgur
