// SPDX-License-Identifier: Apache-2.0
// Per-op tests of the shape rules (rules/shape.cpp): copies, views, slicing, cat and stack.
// Tolerances and method: xla_rules/graphs.h and xla_rules/lazy_ops.h.

#include "xla_rules/lazy_ops.h"
#include "xla_rules/graphs.h"

using namespace xla_rules;
using torch::indexing::None;
using torch::indexing::Slice;

// Slicing (slice_copy) with steps, negative and out-of-range bounds, narrow and tensor indexing,
// and the backward's slice_scatter; select with its backward's select_scatter (a negative index,
// the first and a middle one); copy_ into a tensor (broadcast, and into
// another dtype). slice_backward's copy_ into a zero tensor and copy_ itself become the
// functional aten::copy, which the lazy core has no node for (it ran on the host): fulgur's Lazy
// kernel (src/xla/lazy_views.cpp) writes it as _to_copy and expand_copy.
TEST(XlaOps, SlicingAndItsBackward) {
  torch::manual_seed(6);
  Options o;
  check_op("slice(1, 1, 5, 2)", [](const auto& x) { return x[0].slice(1, 1, 5, 2) * 2; }, {torch::randn({4, 6})}, o);
  check_op("slice(0, -3, 100, 3)", [](const auto& x) { return x[0].slice(0, -3, 100, 3) * 2; }, {torch::randn({8, 3})}, o);
  check_op("narrow(2, 1, 2)", [](const auto& x) { return x[0].narrow(2, 1, 2) * 2; }, {torch::randn({2, 3, 4})}, o);
  check_op("[1:, :-1]", [](const auto& x) { return x[0].index({Slice(1, None), Slice(None, -1)}) * 2; },
           {torch::randn({4, 6})}, o);
  check_op("bf16 [:, ::2]", [](const auto& x) { return x[0].index({Slice(), Slice(None, None, 2)}) * 2; },
           {torch::randn({3, 7}).to(torch::kBFloat16)}, bf16_options(o));
  check_op("select(1, -1)", [](const auto& x) { return x[0].select(1, -1) * 2; }, {torch::randn({4, 6, 3})}, o);
  check_op("select(0, 0) and select(2, 1)", [](const auto& x) { return x[0].select(0, 0) * x[0].select(2, 1); },
           {torch::randn({3, 3, 3})}, o);
  check_op("copy_ of [5] into zeros [3, 5]", [](const auto& x) {
    auto z = torch::zeros({3, 5}, x[0].options().requires_grad(false));
    z.copy_(x[0]);
    return z * 2;
  }, {torch::randn({5})}, o);
  Options forward = o;
  forward.backward = false;
  check_op("copy_ of float32 into float64", [](const auto& x) {
    auto z = torch::zeros({2, 3}, x[0].options().dtype(torch::kDouble));
    z.copy_(x[0]);
    return z;
  }, {torch::randn({2, 3})}, forward);
}

// permute (and its backward, the inverse permute), squeeze and unsqueeze.
TEST(XlaOps, PermuteSqueezeUnsqueezeAndTheirBackwards) {
  torch::manual_seed(7);
  check_op("permute(2, 0, 1)", [](const auto& x) { return x[0].permute({2, 0, 1}) * x[1]; },
           {torch::randn({2, 3, 4}), torch::randn({3})});
  check_op("permute(0, 2, 1, 3) bf16", [](const auto& x) { return x[0].permute({0, 2, 1, 3}) * 2; },
           {torch::randn({2, 3, 4, 5}).to(torch::kBFloat16)}, bf16_options());
  check_op("squeeze then unsqueeze", [](const auto& x) { return x[0].squeeze(1).unsqueeze(0) * 2; },
           {torch::randn({4, 1, 5})});
}

TEST(StableHlo, ZeroCopiesViewsAndTransposes) {
  const std::string ir = R"IR(
graph(%a : Tensor, %b : Tensor):
  %none : NoneType = prim::Constant()
  %false : bool = prim::Constant[value=0]()
  %f32 : int = prim::Constant[value=6]()
  %i64 : int = prim::Constant[value=4]()
  %shape : int[] = prim::Constant[value=[6, 4]]()
  %wide : int[] = prim::Constant[value=[5, 2, 3, 4]]()
  %d0 : int = prim::Constant[value=0]()
  %d2 : int = prim::Constant[value=-1]()
  %z : Tensor = aten::zero(%a)
  %zl : Tensor = aten::zeros_like(%b, %none, %none, %none, %none, %none)
  %det : Tensor = aten::detach_copy(%a)
  %tof : Tensor = aten::_to_copy(%b, %f32, %none, %none, %none, %false, %none)
  %toi : Tensor = aten::_to_copy(%a, %i64, %none, %none, %none, %false, %none)
  %v : Tensor = aten::view_copy(%a, %shape)
  %t : Tensor = aten::t_copy(%v)
  %tr : Tensor = aten::transpose_copy(%a, %d0, %d2)
  %e : Tensor = aten::expand_copy(%a, %wide, %false)
  return (%z, %zl, %det, %tof, %toi, %v, %t, %tr, %e)
)IR";
  torch::manual_seed(1);
  const auto a = torch::randn({2, 3, 4}) * 4;
  check(ir, {a, torch::tensor({true, false})}, "[2,3,4]");
}

TEST(StableHlo, StackCatAndSelectCopy) {
  // The logging's weighted mean: stack a float32 and a float64 0-d tensor (promoted), read rows
  // back with select_copy (a negative index too); cat along a middle dim.
  const std::string ir = R"IR(
graph(%a : Tensor, %b : Tensor, %x : Tensor, %y : Tensor):
  %zero : int = prim::Constant[value=0]()
  %one : int = prim::Constant[value=1]()
  %last : int = prim::Constant[value=-1]()
  %l : Tensor[] = prim::ListConstruct(%a, %b)
  %s : Tensor = aten::stack(%l, %zero)
  %s0 : Tensor = aten::select_copy(%s, %zero, %zero)
  %s1 : Tensor = aten::select_copy(%s, %zero, %last)
  %m : Tensor[] = prim::ListConstruct(%x, %y, %x)
  %c : Tensor = aten::cat(%m, %one)
  %t : Tensor = aten::stack(%m, %last)
  %r : Tensor = aten::select_copy(%c, %one, %last)
  return (%s, %s0, %s1, %c, %t, %r)
)IR";
  torch::manual_seed(14);
  check(ir, {torch::randn({}), torch::randn({}, torch::kDouble), torch::randn({2, 3, 4}), torch::randn({2, 3, 4})},
        "0-d and [2,3,4]");
}
