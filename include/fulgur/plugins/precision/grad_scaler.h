// SPDX-License-Identifier: Apache-2.0
#pragma once
// GradScaler: dynamic loss scaling for float16 mixed precision ("16-mixed"),
// as torch.amp.GradScaler: the loss is multiplied by `scale` before backward
// so that small float16 gradients do not flush to zero; before the optimizer
// step the gradients are divided by it again and checked; a step whose
// gradients hold an inf or NaN is skipped and the scale is multiplied by
// `backoff_factor`; after `growth_interval` finite steps in a row the scale
// grows by `growth_factor`. Works on CPU and CUDA tensors (libtorch's
// _amp_foreach_non_finite_check_and_unscale_ and _amp_update_scale_).

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <string>

namespace torch::optim {
class Optimizer;
}  // namespace torch::optim

namespace fulgur {

class GradScaler {
 public:
  // torch.amp.GradScaler's defaults. Throws std::invalid_argument naming a
  // value that is not allowed: init_scale must be finite and > 0,
  // growth_factor > 1, backoff_factor in (0, 1), growth_interval >= 1.
  explicit GradScaler(double init_scale = 65536.0, double growth_factor = 2.0, double backoff_factor = 0.5,
                      int64_t growth_interval = 2000);

  // loss * scale (the scale on the loss's device).
  at::Tensor scale(const at::Tensor& loss);
  // Divides every gradient of `optimizer`'s parameters by the scale and
  // records whether any is inf or NaN. Once per step: a second call before
  // update() is an error, as in torch.
  void unscale(torch::optim::Optimizer& optimizer);
  // Whether the gradients unscaled this step held an inf or NaN (the step is skipped).
  bool found_inf() const;
  // Runs optimizer_step() unless found_inf() (unscaling first if unscale()
  // was not called). Returns whether the step ran.
  template <typename Step>
  bool step(torch::optim::Optimizer& optimizer, Step&& optimizer_step) {
    if (!unscaled_) unscale(optimizer);
    if (found_inf()) return false;
    optimizer_step();
    return true;
  }
  // Backs off or grows the scale from this step's result; ends the step.
  void update();

  double get_scale() const;
  int64_t growth_tracker() const;
  // torch.amp.GradScaler.state_dict(): scale, growth_factor, backoff_factor,
  // growth_interval, _growth_tracker.
  c10::Dict<std::string, c10::IValue> state_dict() const;
  // Restores state_dict(); `where` names the source in errors. Throws
  // std::runtime_error for a missing key, a wrong type or a value that is not
  // allowed (a scale that is not finite and positive, a negative tracker).
  void load_state_dict(const c10::Dict<std::string, c10::IValue>& state, const std::string& where);

 private:
  void lazy_init(const c10::Device& device);

  double growth_factor_;
  double backoff_factor_;
  int64_t growth_interval_;
  at::Tensor scale_;           // float32, one element, on the loss's device
  at::Tensor growth_tracker_;  // int32, one element
  at::Tensor found_inf_;       // float32, one element: the sum of the per-device flags
  bool unscaled_ = false;
  // Values loaded before the first step (the device is not known yet).
  double pending_scale_ = 0.0;
  int64_t pending_tracker_ = 0;
};

}  // namespace fulgur
