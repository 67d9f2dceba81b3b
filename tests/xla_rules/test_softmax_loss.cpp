// SPDX-License-Identifier: Apache-2.0
// Per-op tests of the softmax and loss rules (rules/softmax_loss.cpp): softmax, log_softmax, nll_loss.
// Tolerances and method: xla_rules/graphs.h.

#include "xla_rules/graphs.h"

using namespace xla_rules;

TEST(StableHlo, LogSoftmaxNllLossAndTheirBackwardsWithIgnoredTargets) {
  // The MLP's loss and its gradient, as the lazy lowering writes them, with reduction mean (1),
  // sum (2) and none (0), with and without class weights.
  const std::string ir = R"IR(
graph(%x : Tensor, %target : Tensor, %w : Tensor, %grad : Tensor, %gnone : Tensor):
  %none : NoneType = prim::Constant()
  %dim : int = prim::Constant[value=1]()
  %false : bool = prim::Constant[value=0]()
  %mean : int = prim::Constant[value=1]()
  %sum : int = prim::Constant[value=2]()
  %red_none : int = prim::Constant[value=0]()
  %ignore : int = prim::Constant[value=-100]()
  %f32 : int = prim::Constant[value=6]()
  %ls : Tensor = aten::_log_softmax(%x, %dim, %false)
  %l1 : Tensor, %tw1 : Tensor = aten::nll_loss_forward(%ls, %target, %none, %mean, %ignore)
  %l2 : Tensor, %tw2 : Tensor = aten::nll_loss_forward(%ls, %target, %w, %sum, %ignore)
  %l3 : Tensor, %tw3 : Tensor = aten::nll_loss_forward(%ls, %target, %w, %mean, %ignore)
  %l4 : Tensor, %tw4 : Tensor = aten::nll_loss_forward(%ls, %target, %none, %red_none, %ignore)
  %g1 : Tensor = aten::nll_loss_backward(%grad, %ls, %target, %none, %mean, %ignore, %tw1)
  %g3 : Tensor = aten::nll_loss_backward(%grad, %ls, %target, %w, %mean, %ignore, %tw3)
  %g4 : Tensor = aten::nll_loss_backward(%gnone, %ls, %target, %none, %red_none, %ignore, %tw4)
  %gx : Tensor = aten::_log_softmax_backward_data(%g1, %ls, %dim, %f32)
  %gx3 : Tensor = aten::_log_softmax_backward_data(%g3, %ls, %dim, %f32)
  return (%ls, %l1, %tw1, %l2, %tw2, %l3, %tw3, %l4, %g1, %g3, %g4, %gx, %gx3)
)IR";
  torch::manual_seed(4);
  for (const auto& [n, c] : {std::pair<int64_t, int64_t>{64, 10}, {5, 3}, {1, 7}}) {
    check(ir,
          {torch::randn({n, c}) * 3, targets(n, c, 4), torch::rand({c}) + 0.1, torch::scalar_tensor(1.5),
           torch::randn({n})},
          "N " + std::to_string(n) + ", C " + std::to_string(c));
  }
  // Every target ignored: the mean is 0/0 = nan in libtorch too; only the sum reductions are compared.
  const std::string sums = R"IR(
graph(%x : Tensor, %target : Tensor):
  %none : NoneType = prim::Constant()
  %sum : int = prim::Constant[value=2]()
  %ignore : int = prim::Constant[value=-100]()
  %l : Tensor, %tw : Tensor = aten::nll_loss_forward(%x, %target, %none, %sum, %ignore)
  return (%l, %tw)
)IR";
  check(sums, {torch::randn({3, 4}), torch::full({3}, -100, torch::kLong)}, "all ignored");
  // A 1-d input with a 0-d target.
  check(sums, {torch::randn({4}), torch::scalar_tensor(2, torch::kLong)}, "[4] and a 0-d target");
}

TEST(StableHlo, SoftmaxAndItsBackward) {
  const std::string ir = R"IR(
graph(%x : Tensor, %g : Tensor):
  %dim : int = prim::Constant[value=-1]()
  %false : bool = prim::Constant[value=0]()
  %f32 : int = prim::Constant[value=6]()
  %s : Tensor = aten::_softmax(%x, %dim, %false)
  %gs : Tensor = aten::_softmax_backward_data(%g, %s, %dim, %f32)
  return (%s, %gs)
)IR";
  torch::manual_seed(5);
  check(ir, {torch::randn({2, 4, 8}) * 5, torch::randn({2, 4, 8})}, "[2,4,8]");
  check(ir, {torch::randn({3, 1}), torch::randn({3, 1})}, "[3,1]");
}
