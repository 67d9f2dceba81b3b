// SPDX-License-Identifier: Apache-2.0
// Per-op tests of the normalization rules (rules/norm.cpp): layer norm and batch norm.
// Tolerances and method: xla_rules/graphs.h.

#include "xla_rules/graphs.h"

using namespace xla_rules;

TEST(StableHlo, NativeLayerNormWithAndWithoutAffine) {
  const std::string ir = R"IR(
graph(%x : Tensor, %w : Tensor, %b : Tensor):
  %none : NoneType = prim::Constant()
  %last : int[] = prim::Constant[value=[8]]()
  %two : int[] = prim::Constant[value=[3, 8]]()
  %eps : float = prim::Constant[value=1.0000000000000001e-05]()
  %y : Tensor, %mean : Tensor, %rstd : Tensor = aten::native_layer_norm(%x, %last, %w, %b, %eps)
  %y2 : Tensor, %mean2 : Tensor, %rstd2 : Tensor = aten::native_layer_norm(%x, %two, %none, %none, %eps)
  return (%y, %mean, %rstd, %y2, %mean2, %rstd2)
)IR";
  torch::manual_seed(7);
  check(ir, {torch::randn({2, 3, 8}) * 2 + 1, torch::randn({8}), torch::randn({8})}, "[2,3,8]");
}

TEST(StableHlo, NativeLayerNormBackward) {
  // Fed the forward's own mean and rstd, as in a training step.
  const std::string ir = R"IR(
graph(%x : Tensor, %w : Tensor, %b : Tensor, %g : Tensor):
  %none : NoneType = prim::Constant()
  %last : int[] = prim::Constant[value=[8]]()
  %eps : float = prim::Constant[value=1.0000000000000001e-05]()
  %all : bool[] = prim::Constant[value=[1, 1, 1]]()
  %input : bool[] = prim::Constant[value=[1, 0, 0]]()
  %y : Tensor, %mean : Tensor, %rstd : Tensor = aten::native_layer_norm(%x, %last, %w, %b, %eps)
  %gx : Tensor, %gw : Tensor, %gb : Tensor = aten::native_layer_norm_backward(%g, %x, %last, %mean, %rstd, %w, %b, %all)
  %gx2 : Tensor, %gw2 : Tensor, %gb2 : Tensor = aten::native_layer_norm_backward(%g, %x, %last, %mean, %rstd, %none, %none, %input)
  return (%gx, %gw, %gb, %gx2)
)IR";
  torch::manual_seed(9);
  check(ir, {torch::randn({2, 3, 8}) * 2 + 1, torch::randn({8}), torch::randn({8}), torch::randn({2, 3, 8})},
        "[2,3,8]");
  check(ir, {torch::randn({5, 8}), torch::randn({8}), torch::randn({8}), torch::randn({5, 8})}, "[5,8]");
}

TEST(StableHlo, BatchNormTrainsEvaluatesAndUpdatesItsRunningStatistics) {
  // Training then evaluation on the same running statistics: the training op writes them in
  // place (libtorch's kernel, the TorchScript interpreter), so the evaluation reads the updated
  // ones, and @main returns them after the graph's outputs (Emission::updated_inputs).
  const std::string ir = R"IR(
graph(%x : Tensor, %w : Tensor, %b : Tensor, %rm : Tensor, %rv : Tensor, %g : Tensor):
  %true : bool = prim::Constant[value=1]()
  %false : bool = prim::Constant[value=0]()
  %none : NoneType = prim::Constant()
  %momentum : float = prim::Constant[value=0.10000000000000001]()
  %eps : float = prim::Constant[value=1.0000000000000001e-05]()
  %all : bool[] = prim::Constant[value=[1, 1, 1]]()
  %input : bool[] = prim::Constant[value=[1, 0, 0]]()
  %y : Tensor, %sm : Tensor, %si : Tensor = aten::native_batch_norm(%x, %w, %b, %rm, %rv, %true, %momentum, %eps)
  %gx : Tensor, %gw : Tensor, %gb : Tensor = aten::native_batch_norm_backward(%g, %x, %w, %rm, %rv, %sm, %si, %true, %eps, %all)
  %ye : Tensor, %em : Tensor, %ei : Tensor = aten::native_batch_norm(%x, %w, %b, %rm, %rv, %false, %momentum, %eps)
  %gxe : Tensor, %gwe : Tensor, %gbe : Tensor = aten::native_batch_norm_backward(%g, %x, %none, %rm, %rv, %none, %none, %false, %eps, %input)
  return (%y, %sm, %si, %gx, %gw, %gb, %ye, %em, %gxe)
)IR";
  torch::manual_seed(12);
  for (const std::vector<int64_t>& dims : {std::vector<int64_t>{6, 4}, std::vector<int64_t>{3, 4, 5, 2}}) {
    const std::string label = c10::str(c10::IntArrayRef(dims));
    SCOPED_TRACE(label);
    const std::vector<int64_t> c = {dims[1]};
    const std::vector<torch::Tensor> in = {torch::randn(dims) * 3 + 1, torch::randn(c), torch::randn(c),
                                           torch::randn(c), torch::rand(c) + 0.5, torch::randn(dims)};
    std::vector<IValue> eager_inputs;
    for (const auto& t : in) eager_inputs.emplace_back(t.clone());
    const auto graph = parse(ir);
    const std::vector<IValue> want = run_eager_and_type(*graph, eager_inputs);  // updates inputs 3 and 4
    const Emission e = emit_stablehlo(*graph);
    EXPECT_EQ(e.updated_inputs, (std::vector<size_t>{3, 4}));
    EXPECT_EQ(fulgur::xla::stablehlo::inputs_updated_in_place(*graph), (std::vector<size_t>{3, 4}));
    std::vector<IValue> inputs(in.begin(), in.end());
    std::vector<torch::Tensor> got = run_on_pjrt(*graph, inputs);
    ASSERT_EQ(got.size(), want.size() + 2);
    const std::vector<torch::Tensor> updated = {got[want.size()], got[want.size() + 1]};
    got.resize(want.size());
    expect_same(got, want, {}, label);
    expect_same(updated, {eager_inputs[3], eager_inputs[4]}, {}, label + " running statistics");
  }
}
