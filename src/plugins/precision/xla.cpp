// SPDX-License-Identifier: Apache-2.0
#include <fulgur/plugins/precision/xla.h>

#include <torch/nn/module.h>
#include <torch/utils.h>

#include <fulgur/xla/backend.h>

#include "optim/optim_state.h"

#include <vector>

namespace fulgur {
namespace {

// Runs the closure, then gives each gradient that autograd handed over to a
// parameter without one a tensor of its own. Such a gradient is the backward's
// own tensor, on a lazy device often a view (a weight's gradient is the
// transpose of a matmul), and the view keeps its base alive: the step's graph
// would write out the base as well as the view, and copy one into the other.
// The clone is a value of its own, which XLA computes in place of the base
// (faster on the MNIST MLP with gradients set to none: bench/history/libtorch-1.13.md).
void run_closure(const torch::nn::Module& module, const std::function<void()>& closure) {
  if (!closure) return;
  std::vector<at::Tensor> params = module.parameters();
  std::vector<bool> had_grad;
  had_grad.reserve(params.size());
  for (const auto& p : params) had_grad.push_back(p.grad().defined());
  closure();
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    auto& p = params[i];
    if (!had_grad[i] && p.grad().defined() && p.grad().device().type() == c10::kLazy) p.mutable_grad() = p.grad().clone();
  }
}

}  // namespace

void XLAPrecision::optimizer_step(torch::optim::Optimizer& optimizer, const torch::nn::Module& module,
                                  const std::function<void()>& closure, const std::function<void()>& before_step) const {
  run_closure(module, closure);
  // Where the backend compiles the update into the backward (pjrt), the forward, backward and
  // update are one graph unless before_step marks a step (XLAStrategy::sync_gradients does on
  // several processes, where Gloo needs the gradients): a step has one graph to sync and run
  // instead of two. Elsewhere (the TorchScript backend) the forward and backward stay a graph of
  // their own (docs/DECISIONS.md, "One graph per step").
  if (!xla::backend().update_joins_backward_graph()) xla::mark_step();
  if (before_step) before_step();
  update(optimizer);
  xla::mark_step();
}

}  // namespace fulgur
