// SPDX-License-Identifier: Apache-2.0
#pragma once
// Adam's and AdamW's update of one parameter on an xla (lazy) device, traced as one lazy IR
// node instead of libtorch's eight ops.
//
// Traced through libtorch, Adam::step makes eight IR nodes per parameter and a device-data
// node for each of its seven numbers (48 of the 72 device-data nodes of the MNIST MLP's update),
// and every one is hashed, walked and bound at each step: 0.36 ms of host time a step on the
// MLP. Here a parameter's update is one node whose three outputs are the new parameter,
// exp_avg and exp_avg_sq, and the numbers of a step are device data shared by every parameter
// that uses the same value. The node lowers to the aten ops of libtorch 1.13's Adam::step, in
// its order and with its double numbers, so the graph computes what libtorch's traced step
// computes, and both backends (pjrt and ts) run it.
//
// Thread safety: a LazyAdamStep is used by one thread at a time, like the optimizer.

#include <ATen/core/Tensor.h>

#include <memory>

namespace fulgur::xla {

// The numbers of one parameter's update, as libtorch 1.13's Adam::step and AdamW::step compute
// them from the options and the step count.
struct AdamNumbers {
  double beta1 = 0, one_minus_beta1 = 0, beta2 = 0, one_minus_beta2 = 0;
  double bias_correction2_sqrt = 0;  // sqrt(1 - beta2^step)
  double eps = 0;
  double neg_step_size = 0;  // -lr / (1 - beta1^step)
  enum class Decay { none, adam, adamw };
  Decay decay = Decay::none;
  // adam: weight_decay (the gradient becomes grad + weight_decay * p);
  // adamw: 1 - lr * weight_decay (the parameter is scaled by it first).
  double decay_value = 0;
};

// True if `update` can take `t` for a parameter `like`: both lazy tensors (functionalized or
// not) on the same device, dense, of the same floating dtype and sizes.
bool lazy_adam_takes(const at::Tensor& like, const at::Tensor& t);

// The updates of one optimizer step.
class LazyAdamStep {
 public:
  LazyAdamStep();
  ~LazyAdamStep();
  LazyAdamStep(const LazyAdamStep&) = delete;
  LazyAdamStep& operator=(const LazyAdamStep&) = delete;

  // Sets p, exp_avg and exp_avg_sq to their values after one Adam (AdamW) update with
  // gradient `grad`, as pending lazy computations (in place, as libtorch's step does: their
  // version counters are bumped). REQUIRES: lazy_adam_takes(p, t) for grad, exp_avg, exp_avg_sq.
  void update(const at::Tensor& p, const at::Tensor& grad, const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq,
              const AdamNumbers& numbers);

 private:
  struct Numbers;  // the device data of the step's numbers, by value
  std::unique_ptr<Numbers> numbers_;
};

}  // namespace fulgur::xla
