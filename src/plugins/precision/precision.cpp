#include <fulgur/plugins/precision/precision.h>

#include "optim/fused_adam.h"

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <stdexcept>

namespace fulgur {

std::string validate_precision(const std::string& name) {
  if (name == "32") return "32-true";
  if (name == "bf16") return "bf16-mixed";
  if (name == "32-true" || name == "bf16-true" || name == "bf16-mixed") return name;
  std::string why;
  if (name == "16-mixed" || name == "16") {
    why = " (float16 autocast needs a GPU, as in Lightning, and fulgur runs on the CPU and xla; for mixed "
          "precision on the CPU use \"bf16-mixed\")";
  } else if (name == "16-true") {
    why = " (float16 weights are not implemented by fulgur yet; use \"bf16-true\")";
  }
  throw std::invalid_argument("precision '" + name + "' is not supported; valid: \"32-true\", \"bf16-mixed\", \"bf16-true\"" +
                              why);
}

Precision::Precision(std::string name) : name_(validate_precision(name)) {}

c10::ScalarType Precision::dtype() const { return name_ == "bf16-true" ? torch::kBFloat16 : torch::kFloat32; }

std::optional<c10::ScalarType> Precision::autocast_dtype() const {
  if (name_ == "bf16-mixed") return torch::kBFloat16;
  return std::nullopt;
}

ForwardContext::ForwardContext(const Precision& precision) {
  const auto dtype = precision.autocast_dtype();
  if (!dtype) return;
  active_ = true;
  was_enabled_ = at::autocast::is_cpu_enabled();
  previous_dtype_ = at::autocast::get_autocast_cpu_dtype();
  at::autocast::set_cpu_enabled(true);
  at::autocast::set_autocast_cpu_dtype(*dtype);
  at::autocast::increment_nesting();
}

ForwardContext::~ForwardContext() {
  if (!active_) return;
  // The outermost context drops the cached bfloat16 copies of the weights, as torch.autocast does.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_cpu_enabled(was_enabled_);
  at::autocast::set_autocast_cpu_dtype(previous_dtype_);
}

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

void Precision::update(torch::optim::Optimizer& optimizer) {
  if (!detail::fused_optimizer_step(optimizer)) optimizer.step();
}

void Precision::optimizer_step(torch::optim::Optimizer& optimizer, const torch::nn::Module& /*module*/,
                               const std::function<void()>& closure, const std::function<void()>& before_step) const {
  if (closure) closure();
  if (before_step) before_step();
  update(optimizer);
}

}  // namespace fulgur
