// SPDX-License-Identifier: Apache-2.0
// Per-op tests of the linear algebra rules (rules/linalg.cpp): mm, bmm, addmm.
// Tolerances and method: xla_rules/graphs.h.

#include "xla_rules/graphs.h"

using namespace xla_rules;

TEST(StableHlo, MatmulsWithAlphaAndBeta) {
  const std::string ir = R"IR(
graph(%self : Tensor, %m1 : Tensor, %m2 : Tensor, %beta : int, %alpha : int, %x : Tensor, %y : Tensor, %fbeta : float):
  %half : float = prim::Constant[value=0.5]()
  %two : float = prim::Constant[value=2.]()
  %zero : int = prim::Constant[value=0]()
  %mm : Tensor = aten::mm(%m1, %m2)
  %a1 : Tensor = aten::addmm(%self, %m1, %m2, %beta, %alpha)
  %a2 : Tensor = aten::addmm(%self, %m1, %m2, %half, %two)
  %a3 : Tensor = aten::addmm(%self, %m1, %m2, %zero, %alpha)
  %a4 : Tensor = aten::addmm(%self, %m1, %m2, %fbeta, %alpha)
  %b : Tensor = aten::bmm(%x, %y)
  return (%mm, %a1, %a2, %a3, %a4, %b)
)IR";
  torch::manual_seed(2);
  check(ir, {torch::randn({5}), torch::randn({3, 4}), torch::randn({4, 5}), int64_t{1}, int64_t{1},
             torch::randn({2, 3, 4}), torch::randn({2, 4, 6}), 0.25},
        "bias [5], alpha = beta = 1");
  // beta = 0 (a graph input): nan in self does not reach the result, as in libtorch.
  check(ir, {torch::full({1, 5}, NAN), torch::randn({7, 3}), torch::randn({3, 5}), int64_t{3}, int64_t{-2},
             torch::randn({1, 2, 3}), torch::randn({1, 3, 2}), 0.0},
        "self [1,5] of nan, beta = 0");
}
