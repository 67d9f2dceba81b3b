// SPDX-License-Identifier: Apache-2.0
// Automatic optimization (gradient accumulation, clipping, the step) and manual optimization.

#include "trainer/loops/optimization.h"

#include <fulgur/lightning_module.h>
#include <fulgur/strategies/strategy.h>

#include "trainer/trainer_impl.h"

#include <torch/optim/optimizer.h>
#include <torch/torch.h>

#include <stdexcept>

namespace fulgur::detail {

AutomaticOptimization::Result AutomaticOptimization::run(const Batch& batch, int64_t batch_idx, bool last) {
  Result result;
  ++t_.progress.accumulated;
  result.stepped = t_.progress.accumulated >= accumulate_grad_batches_ || last;
  step(batch, batch_idx, result.output, result.stepped);
  if (result.stepped) t_.progress.accumulated = 0;
  return result;
}

void AutomaticOptimization::step(const Batch& batch, int64_t batch_idx, StepOutput& out, bool sync_now) {
  Strategy& strategy = *t_.strategy;
  auto& optimizer = *strategy.optimizer_config().optimizers.at(0);
  const double k = static_cast<double>(accumulate_grad_batches_);
  auto closure = [&] {
    in_training_step_ = true;
    out = strategy.training_step(batch, batch_idx);
    in_training_step_ = false;
    if (!out.has_loss()) {
      throw std::runtime_error("training_step returned " + std::string(out.empty() ? "nothing" : "a dict without \"loss\"") +
                               " at batch " + std::to_string(batch_idx) +
                               "; under automatic optimization it must return the loss (or a dict holding \"loss\"), "
                               "or call set_automatic_optimization(false)");
    }
    strategy.backward(k > 1 ? out.loss() / k : out.loss());
  };
  if (!sync_now) {
    strategy.set_gradient_sync(false);
    closure();
    return;
  }
  strategy.set_gradient_sync(true);
  strategy.optimizer_step(optimizer, closure, [&] {
    t_.model->on_before_optimizer_step(optimizer);
    clip_gradients(optimizer);
  });
  // As Lightning's optimizer.zero_grad() (PyTorch's set_to_none=True): the next
  // backward hands its gradients over instead of adding them to zeros.
  for (auto& group : optimizer.param_groups())
    for (auto& p : group.params()) p.mutable_grad() = at::Tensor();
  ++t_.progress.global_step;
}

void AutomaticOptimization::clip_gradients(torch::optim::Optimizer& optimizer) {
  if (!t_.resolved.gradient_clip_val) return;
  const double clip = *t_.resolved.gradient_clip_val;
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> grads;
  for (auto& g : optimizer.param_groups())
    for (auto& p : g.params())
      if (p.grad().defined()) grads.push_back(p.mutable_grad());
  if (grads.empty()) return;
  if (t_.options.gradient_clip_algorithm() == "value") {
    for (auto& g : grads) g.clamp_(-clip, clip);
    return;
  }
  // Norm clipping without reading the norm on the host (no sync on xla devices).
  std::vector<at::Tensor> norms;
  for (auto& g : grads) norms.push_back(g.norm(2).to(torch::kFloat32));
  auto total = torch::stack(norms).norm(2);
  // clamp(max=1), as PyTorch's clip_grad_norm_ writes it: libtorch's lazy core has a node for
  // aten::clamp and none for aten::clamp_max, which would run on the host and split the step.
  auto coef = (clip / (total + 1e-6)).clamp(std::nullopt, 1.0);
  for (auto& g : grads) g.mul_(coef.to(g.scalar_type()));
}

StepOutput ManualOptimization::run(const Batch& batch, int64_t batch_idx) {
  in_training_step_ = true;
  StepOutput out = t_.strategy->training_step(batch, batch_idx);
  in_training_step_ = false;
  return out;
}

void ManualOptimization::optimizer_step(torch::optim::Optimizer& optimizer, const std::function<void()>& closure) {
  t_.strategy->optimizer_step(optimizer, closure, nullptr);
  ++t_.progress.global_step;
}

}  // namespace fulgur::detail
