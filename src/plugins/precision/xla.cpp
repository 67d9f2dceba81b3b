#include <fulgur/plugins/precision/xla.h>

#include <torch/nn/module.h>

#include <fulgur/xla/backend.h>

#include "optim/optim_state.h"

#include <vector>

namespace fulgur {
namespace {

// The module's parameters, their grads, its buffers and the optimizer's state
// tensors, whose functionalization history is dropped once per step.
void apply_pending_updates(const torch::nn::Module& module, torch::optim::Optimizer& optimizer) {
  std::vector<at::Tensor> ts;
  for (const auto& p : module.parameters()) {
    ts.push_back(p);
    ts.push_back(p.grad());
  }
  for (const auto& b : module.buffers()) ts.push_back(b);
  for (const auto& [key, state] : optimizer.state()) {
    detail::map_state_tensors(*state, [&](const at::Tensor& t) {
      ts.push_back(t);
      return t;
    });
  }
  xla::apply_pending_updates(ts);
}

}  // namespace

void XLAPrecision::optimizer_step(torch::optim::Optimizer& optimizer, const torch::nn::Module& module,
                                  const std::function<void()>& closure, const std::function<void()>& before_step) const {
  if (closure) closure();
  // The forward and backward run as their own graph before the update:
  // gradients must be materialized for Gloo anyway, and on one process one
  // graph for the whole step was slower with the TorchScript backend (charlm
  // 152 against 115 ms, MNIST CNN 95 against 65 ms).
  xla::mark_step();
  if (before_step) before_step();
  update(optimizer);
  apply_pending_updates(module, optimizer);
  xla::mark_step();
}

}  // namespace fulgur
