// SPDX-License-Identifier: Apache-2.0
#include <fulgur/plugins/precision/precision.h>

#include "optim/fused_adam.h"
#include "xla/lazy_autocast.h"

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <stdexcept>

namespace fulgur {

std::string validate_precision(const std::string& name) {
  if (name == "32") return "32-true";
  if (name == "bf16") return "bf16-mixed";
  if (name == "16") return "16-mixed";
  if (name == "32-true" || name == "bf16-true" || name == "bf16-mixed" || name == "16-mixed") return name;
  std::string why;
  if (name == "16-true") why = " (float16 weights are not implemented by fulgur yet; use \"bf16-true\")";
  throw std::invalid_argument("precision '" + name +
                              "' is not supported; valid: \"32-true\", \"bf16-mixed\", \"bf16-true\", \"16-mixed\"" + why);
}

void check_precision_device(const Precision& precision, const c10::Device& device) {
  if (precision.needs_cuda() && !device.is_cuda()) {
    throw std::invalid_argument("precision '" + precision.name() + "' is float16 autocast, which runs on CUDA devices (as in "
                                "Lightning), but the device is " + device.str() +
                                "; use accelerator \"cuda\", or \"bf16-mixed\" for mixed precision on this device");
  }
}

Precision::Precision(std::string name) : name_(validate_precision(name)) {
  if (name_ == "16-mixed") scaler_ = std::make_shared<GradScaler>();
}

c10::ScalarType Precision::dtype() const { return name_ == "bf16-true" ? torch::kBFloat16 : torch::kFloat32; }

std::optional<c10::ScalarType> Precision::autocast_dtype() const {
  if (name_ == "bf16-mixed") return torch::kBFloat16;
  if (name_ == "16-mixed") return torch::kHalf;
  return std::nullopt;
}

at::Tensor Precision::pre_backward(const at::Tensor& loss) const { return scaler_ ? scaler_->scale(loss) : loss; }

void Precision::unscale_gradients(torch::optim::Optimizer& optimizer) const {
  if (scaler_) scaler_->unscale(optimizer);
}

std::optional<c10::Dict<std::string, c10::IValue>> Precision::state_dict() const {
  if (!scaler_) return std::nullopt;
  return scaler_->state_dict();
}

void Precision::load_state_dict(const c10::Dict<std::string, c10::IValue>& state, const std::string& where) const {
  if (scaler_) scaler_->load_state_dict(state, where);
}

ForwardContext::ForwardContext(const Precision& precision) {
  const auto dtype = precision.autocast_dtype();
  if (!dtype) return;
  active_ = true;
  was_cpu_enabled_ = at::autocast::is_autocast_enabled(at::kCPU);
  previous_cpu_dtype_ = at::autocast::get_autocast_dtype(at::kCPU);
  was_cuda_enabled_ = at::autocast::is_autocast_enabled(at::kCUDA);
  previous_cuda_dtype_ = at::autocast::get_autocast_dtype(at::kCUDA);
  // Autocast acts per device type: bfloat16 autocast for the CPU and CUDA tensors
  // of a step, float16 only for CUDA ones (check_precision_device keeps 16-mixed there).
  if (*dtype == torch::kBFloat16) {
    at::autocast::set_autocast_enabled(at::kCPU, true);
    at::autocast::set_autocast_dtype(at::kCPU, *dtype);
  }
  at::autocast::set_autocast_enabled(at::kCUDA, true);
  at::autocast::set_autocast_dtype(at::kCUDA, *dtype);
  at::autocast::increment_nesting();
  if (precision.autocasts_xla_tensors()) {
    xla_ = true;
    const xla::detail::LazyAutocastState previous = xla::detail::enter_lazy_autocast(*dtype);
    was_xla_included_ = previous.included;
    was_xla_enabled_ = previous.enabled;
    previous_xla_dtype_ = previous.dtype;
  }
}

ForwardContext::~ForwardContext() {
  if (!active_) return;
  if (xla_) xla::detail::exit_lazy_autocast({was_xla_included_, was_xla_enabled_, previous_xla_dtype_});
  // The outermost context drops the cached bfloat16 copies of the weights, as torch.autocast does.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(at::kCPU, was_cpu_enabled_);
  at::autocast::set_autocast_dtype(at::kCPU, previous_cpu_dtype_);
  at::autocast::set_autocast_enabled(at::kCUDA, was_cuda_enabled_);
  at::autocast::set_autocast_dtype(at::kCUDA, previous_cuda_dtype_);
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
  if (!scaler_) {
    update(optimizer);
    return;
  }
  // The scaler unscaled the gradients in before_step (unscale_gradients); a
  // step whose gradients overflowed is skipped, and the scale learns from it.
  scaler_->step(optimizer, [&] { update(optimizer); });
  scaler_->update();
}

}  // namespace fulgur
