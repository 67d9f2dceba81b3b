// SPDX-License-Identifier: Apache-2.0
// Per-op tests of the index rules (rules/index.cpp): embedding, index_select, gather, scatter,
// triu/tril.
// Tolerances and method: xla_rules/graphs.h and xla_rules/lazy_ops.h.

#include "xla_rules/lazy_ops.h"
#include "xla_rules/graphs.h"

using namespace xla_rules;
using torch::indexing::None;
using torch::indexing::Slice;

// triu and tril over the last two dims, diagonals below, on and above, batched, with their
// backwards (the same mask on the gradient).
TEST(XlaOps, TriuTrilAndTheirBackwards) {
  torch::manual_seed(5);
  for (int64_t d : {-1, 0, 2}) {
    check_op("triu " + std::to_string(d), [d](const auto& x) { return x[0].triu(d); }, {torch::randn({4, 6})});
    check_op("tril " + std::to_string(d), [d](const auto& x) { return x[0].tril(d); }, {torch::randn({2, 3, 5, 4})});
  }
  check_op("triu bf16", [](const auto& x) { return x[0].triu(1); }, {torch::randn({5, 5}).to(torch::kBFloat16)},
           bf16_options());
  Options o;
  o.backward = false;
  check_op("a causal mask made on the device", [](const auto& x) {
    return torch::ones({4, 4}, torch::TensorOptions().device(x[0].device())).triu(1) * x[0];
  }, {torch::randn({4, 4})}, o);
}

// index_select along each dim, with repeated indices, int32 and int64 indices. Forward only: its
// backward is aten::index_add, for which libtorch's lazy core has no node.
TEST(XlaOps, IndexSelect) {
  torch::manual_seed(8);
  Options o;
  o.backward = false;
  const auto x = torch::randn({5, 4, 3});
  for (int64_t dim : {0, 1, 2}) {
    const auto index = torch::tensor({2, 0, 2, 1}, torch::kLong).remainder(x.size(dim));
    check_op("dim " + std::to_string(dim), [dim](const auto& v) { return v[0].index_select(dim, v[1]); }, {x, index}, o);
    check_op("dim " + std::to_string(dim) + ", int32 index",
             [dim](const auto& v) { return v[0].index_select(dim, v[1]); }, {x, index.to(torch::kInt)}, o);
  }
  check_op("bf16", [](const auto& v) { return v[0].index_select(0, v[1]); },
           {x.to(torch::kBFloat16), torch::tensor({4, 4, 0}, torch::kLong)}, bf16_options(o));
}

TEST(StableHlo, EmbeddingGathersRows) {
  const std::string ir = R"IR(
graph(%w : Tensor, %i : Tensor, %j : Tensor):
  %pad : int = prim::Constant[value=-1]()
  %false : bool = prim::Constant[value=0]()
  %e : Tensor = aten::embedding(%w, %i, %pad, %false, %false)
  %f : Tensor = aten::embedding(%w, %j, %pad, %false, %false)
  return (%e, %f)
)IR";
  torch::manual_seed(8);
  check(ir, {torch::randn({77, 16}), torch::randint(77, {4, 6}, torch::kLong), torch::scalar_tensor(76, torch::kLong)},
        "[77,16] by [4,6] and by a 0-d index");
}

TEST(StableHlo, EmbeddingDenseBackwardAddsRepeatedIndicesAndSkipsPadding) {
  const std::string ir = R"IR(
graph(%g : Tensor, %i : Tensor):
  %v : int = prim::Constant[value=10]()
  %nopad : int = prim::Constant[value=-1]()
  %pad : int = prim::Constant[value=3]()
  %false : bool = prim::Constant[value=0]()
  %gw : Tensor = aten::embedding_dense_backward(%g, %i, %v, %nopad, %false)
  %gp : Tensor = aten::embedding_dense_backward(%g, %i, %v, %pad, %false)
  return (%gw, %gp)
)IR";
  torch::manual_seed(13);
  // 3 appears three times (and is the padding index of the second), 9 twice; 0 never.
  const auto indices = torch::tensor(std::vector<int64_t>{3, 9, 3, 1, 9, 3}).reshape({2, 3});
  check(ir, {torch::randn({2, 3, 4}), indices}, "[2,3] indices into 10 rows");
  check(ir, {torch::randn({32, 64, 16}), torch::randint(10, {32, 64}, torch::kLong)}, "[32,64] indices");
}

// scatter (scatter.src, fulgur's aten::scatter node) and scatter_add along each dim, with an
// index smaller than src, and gather, with their backwards (each the other's gather or
// scatter); scatter_add with repeated indices adds them all. The backwards of topk and of max
// and min along a dim (value_selecting_reduction_backward: the gradient scattered into zeros)
// for float32, float64 and bfloat16, largest and smallest, along each dim. A layer whose top 2
// outputs make the loss trains on xla as on the CPU with nothing left on the host.
TEST(XlaOps, ScatterScatterAddAndTheBackwardsOfTopkAndMax) {
  torch::manual_seed(29);
  const auto self = torch::randn({3, 5}), src = torch::randn({3, 4});
  // A permutation per row (scatter's positions must not repeat for a defined result).
  const auto rows = torch::stack({torch::randperm(5).slice(0, 0, 4), torch::randperm(5).slice(0, 0, 4),
                                  torch::randperm(5).slice(0, 0, 4)});
  check_op("scatter dim 1", [rows](const auto& v) { return v[0].scatter(1, rows.to(v[0].device()), v[1]); }, {self, src});
  const auto cols = torch::stack({torch::randperm(3), torch::randperm(3)}).t().contiguous();  // [3, 2]
  // Forward only: libtorch's backward of src (grad.gather(dim, index)) has index's shape.
  Options forward;
  forward.backward = false;
  check_op("scatter dim 0, index smaller than src", [cols](const auto& v) { return v[0].scatter(0, cols.to(v[0].device()), v[1]); },
           {self, src}, forward);
  check_op("scatter_add with repeats", [](const auto& v) {
    return v[0].scatter_add(1, torch::tensor({{0, 0, 4, 4}, {1, 1, 1, 1}, {2, 3, 2, 3}}).to(v[0].device()), v[1]);
  }, {self, src});
  check_op("gather", [rows](const auto& v) { return v[0].gather(1, rows.to(v[0].device())); }, {self});
  check_op("gather dim 0 of [3, 5, 2]", [](const auto& v) {
    return v[0].gather(0, torch::tensor({{{2, 0}, {1, 1}}, {{0, 2}, {2, 2}}}).to(v[0].device()));
  }, {torch::randn({3, 5, 2})});
  check_op("scatter float64", [rows](const auto& v) { return v[0].scatter(1, rows.to(v[0].device()), v[1]); },
           {self.to(torch::kDouble), src.to(torch::kDouble)});

  for (const auto& [name, dtype] : std::vector<std::pair<std::string, torch::Dtype>>{
           {"float32", torch::kFloat}, {"float64", torch::kDouble}, {"bf16", torch::kBFloat16}}) {
    const Options o = dtype == torch::kBFloat16 ? bf16_options() : Options{};
    const auto x = torch::randperm(24).to(dtype).reshape({4, 6});  // no ties: one index per value
    check_op("topk 3 largest " + name, [](const auto& v) { return std::get<0>(v[0].topk(3)); }, {x}, o);
    check_op("topk 2 smallest dim 0 " + name, [](const auto& v) { return std::get<0>(v[0].topk(2, 0, false)); }, {x}, o);
    check_op("max dim 1 " + name, [](const auto& v) { return std::get<0>(v[0].max(1)); }, {x}, o);
    check_op("min dim 0 keepdim " + name, [](const auto& v) { return std::get<0>(v[0].min(0, true)); }, {x}, o);
  }

  struct Net : torch::nn::Module {
    Net() { fc = register_module("fc", torch::nn::Linear(6, 5)); }
    torch::nn::Linear fc{nullptr};
  };
  const auto eager = check_training("a loss on the top 2 outputs", [] { return std::make_shared<Net>(); },
                                    [](torch::nn::Module& m, const torch::Tensor& x) {
                                      const auto top = std::get<0>(static_cast<Net&>(m).fc->forward(x).topk(2));
                                      return (top - 1).square().mean();
                                    },
                                    torch::randn({8, 6}));
  EXPECT_TRUE(eager.empty()) << xla::metrics_report();
}
