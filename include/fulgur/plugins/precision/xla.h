// SPDX-License-Identifier: Apache-2.0
#pragma once
// XLAPrecision: the precision plugin of the xla strategies (Lightning's
// XLAPrecision), which they require. It holds what a lazy device needs around
// an optimizer step, so that no strategy has to know the device.

#include <fulgur/plugins/precision/precision.h>

namespace fulgur {

class XLAPrecision : public Precision {
 public:
  // "32-true", "bf16-true" or "bf16-mixed"; the xla strategies refuse
  // "16-mixed" (float16 autocast is CUDA's).
  using Precision::Precision;
  // bf16-mixed: the steps' forward autocasts lazy tensors to bfloat16
  // (src/xla/lazy_autocast.h): matrix products and convolutions in bfloat16,
  // softmax, norms, reductions and losses in float32, float32 parameters; the
  // casts are ops of the traced graph.
  bool autocasts_xla_tensors() const override { return autocast_dtype().has_value(); }
  // Precision::optimizer_step with the step marks of a lazy device: on the
  // TorchScript backend a step is marked after the closure, so that forward and
  // backward run as their own graph (on PJRT they join the update's graph,
  // unless before_step marks a step to sync the gradients across ranks, as
  // XLAStrategy does); after the update a step is marked, which runs the update.
  // REQUIRES: `module` and the optimizer's parameters on an xla device.
  void optimizer_step(torch::optim::Optimizer& optimizer, const torch::nn::Module& module,
                      const std::function<void()>& closure, const std::function<void()>& before_step) const override;
};

}  // namespace fulgur
