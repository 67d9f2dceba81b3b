// SPDX-License-Identifier: Apache-2.0
// Per-op tests of the reduction rules (rules/reduce.cpp): sums, means, norms, max/min, topk,
// all/any, and torch::equal (all of eq) with MultiheadAttention, which calls it.
// Tolerances and method: xla_rules/graphs.h and xla_rules/lazy_ops.h.

#include "xla_rules/lazy_ops.h"
#include "xla_rules/graphs.h"

using namespace xla_rules;
using torch::indexing::None;
using torch::indexing::Slice;

// topk along the last dim and along dim 0, largest and smallest, k of 1, some and all, on
// float32, bfloat16 and int64; its values and its indices each compared. NaN counts as the
// largest value (first with largest, last with smallest). Ties: only the values are compared (the
// order of tied indices is libtorch's kernel's choice; this lowering gives the smaller index
// first). Forward only here: the backward is XlaOps.ScatterScatterAddAndTheBackwardsOfTopkAndMax's
// (test_index.cpp).
TEST(XlaOps, TopkLargestAndSmallestAlongEachDim) {
  torch::manual_seed(7);
  Options o;
  o.backward = false;
  const auto a = torch::randn({6, 5});
  auto both = [&](const std::string& label, const torch::Tensor& x, int64_t k, int64_t dim, bool largest,
                  const Options& opts) {
    check_op(label + " values", [=](const auto& t) { return std::get<0>(t[0].topk(k, dim, largest)); }, {x}, opts);
    check_op(label + " indices", [=](const auto& t) { return std::get<1>(t[0].topk(k, dim, largest)); }, {x}, opts);
  };
  for (int64_t k : {1, 3, 5}) {
    both("largest k " + std::to_string(k) + " dim -1", a, k, -1, true, o);
    both("smallest k " + std::to_string(k) + " dim -1", a, k, -1, false, o);
  }
  both("largest k 4 dim 0", a, 4, 0, true, o);
  both("smallest k 2 dim 0 of [6, 5, 3]", torch::randn({6, 5, 3}), 2, 0, false, o);
  both("int64", torch::randperm(10, torch::kLong).reshape({2, 5}), 2, 1, true, o);
  both("bf16", torch::randperm(12).to(torch::kBFloat16).reshape({3, 4}), 2, 1, true, bf16_options(o));
  const auto nan_row = torch::tensor({{1.0f, NAN, 3.0f, -INFINITY, INFINITY, 0.0f}});
  both("NaN and inf, largest", nan_row, 3, 1, true, o);
  both("NaN and inf, smallest", nan_row, 6, 1, false, o);
  check_op("ties: values", [](const auto& t) { return std::get<0>(t[0].topk(3)); },
           {torch::tensor({{2.0f, 1.0f, 2.0f, 2.0f, 0.0f}, {1.0f, 1.0f, 1.0f, 1.0f, 1.0f}})}, o);
}

// aten::norm with p 2 (the default), 1, 3, inf, -inf and 0, over all dims and over some with
// keepdim; the lazy core passes p as data, so one program serves every p. With the backward
// (eq, div, masked_fill), an all-zero input included (its gradient is 0, not NaN).
TEST(XlaOps, NormOfEveryOrderAndItsBackward) {
  torch::manual_seed(9);
  for (double p : {2.0, 1.0, 3.0, kInf, -kInf, 0.0}) {
    Options o;
    o.backward = p == 2.0 || p == 1.0 || p == 3.0;
    const std::string name = "p " + std::to_string(p);
    check_op(name, [p](const auto& x) { return x[0].norm(p); }, {torch::randn({4, 5})}, o);
    check_op(name + " over dim 1, keepdim", [p](const auto& x) { return x[0].norm(p, {1}, true); },
             {torch::randn({3, 4, 5})}, o);
    check_op(name + " bf16 of 4096", [p](const auto& x) { return x[0].norm(p); },
             {torch::randn({4096}).to(torch::kBFloat16)}, bf16_options(o));
  }
  check_op("2-norm of zeros", [](const auto& x) { return x[0].norm(2); }, {torch::zeros({3, 2})});
  Options forward_only;
  forward_only.backward = false;
  for (double p : {2.0, kInf, -kInf, 0.0})
    check_op("norm " + std::to_string(p) + " with inf and nan", [p](const auto& x) { return x[0].norm(p); }, {edges()},
             forward_only);
  check_op("inf-norm with inf, no nan", [](const auto& x) { return x[0].norm(kInf); }, {edges().slice(0, 0, 10)},
           forward_only);
}

// max and min of a whole tensor (NaN if any is NaN), and max and min along a dim with their
// indices (the first of ties, the first NaN: metrics take an argmax so, since libtorch's lazy
// core has no node for argmax), in float32, bfloat16 and int64, keepdim both ways; min along a
// dim of bool and of the lowest int64 (min.dim has no lazy node: fulgur's Lazy kernel takes max
// of the values reversed); uint8, int8, int16 and int32.
TEST(XlaOps, MaxAndMinWithIndicesTiesAndNan) {
  torch::manual_seed(13);
  Options o;
  o.backward = false;
  // Ties: integers from a small range; a NaN and ±inf in some rows.
  auto ties = torch::randint(4, {6, 7}).to(torch::kFloat);
  ties[1][3] = kNan;
  ties[1][5] = kNan;
  ties[2][0] = kInf;
  ties[3][6] = -kInf;
  for (const auto& [name, x] : std::vector<std::pair<std::string, torch::Tensor>>{
           {"float32", ties}, {"bf16", ties.to(torch::kBFloat16)}, {"int64", torch::randint(-3, 3, {6, 7}, torch::kLong)}}) {
    for (int64_t dim : {0, 1, -1}) {
      for (bool keep : {false, true}) {
        const std::string label = name + " dim " + std::to_string(dim) + (keep ? " keepdim" : "");
        check_op("max values " + label, [dim, keep](const auto& v) { return std::get<0>(v[0].max(dim, keep)); }, {x}, o);
        check_op("max indices " + label, [dim, keep](const auto& v) { return std::get<1>(v[0].max(dim, keep)); }, {x}, o);
        check_op("min values " + label, [dim, keep](const auto& v) { return std::get<0>(v[0].min(dim, keep)); }, {x}, o);
        check_op("min indices " + label, [dim, keep](const auto& v) { return std::get<1>(v[0].min(dim, keep)); }, {x}, o);
      }
    }
    check_op("max of all " + name, [](const auto& v) { return v[0].max(); }, {x}, o);
    check_op("min of all " + name, [](const auto& v) { return v[0].min(); }, {x}, o);
    check_op("max of all but the NaN row " + name, [](const auto& v) { return v[0].slice(0, 2).max(); }, {x}, o);
  }
  check_op("min of bool along a dim", [](const auto& v) { return std::get<1>(v[0].min(1)); },
           {torch::tensor({{true, false, false}, {true, true, true}})}, o);
  // Integer types narrower than int64 (the reductions start from their own limits).
  for (auto dtype : {torch::kUInt8, torch::kInt8, torch::kInt16, torch::kInt32}) {
    const auto x = torch::tensor({{3, 0, 7}, {127, 5, 5}}).to(dtype);
    check_op("max of all " + c10::str(dtype), [](const auto& v) { return v[0].max(); }, {x}, o);
    check_op("min of all " + c10::str(dtype), [](const auto& v) { return v[0].min(); }, {x}, o);
    check_op("max along dim 1 " + c10::str(dtype), [](const auto& v) { return std::get<1>(v[0].max(1)); }, {x}, o);
    check_op("min along dim 0 " + c10::str(dtype), [](const auto& v) { return std::get<0>(v[0].min(0)); }, {x}, o);
  }
  check_op("min of the lowest int64", [](const auto& v) { return std::get<0>(v[0].min(0)); },
           {torch::tensor({std::numeric_limits<int64_t>::min(), int64_t{0}, std::numeric_limits<int64_t>::max()})}, o);
  check_op("argmax of logits, as a metric", [](const auto& v) { return std::get<1>(v[0].max(1)) == v[1]; },
           {torch::randn({16, 10}), torch::randint(10, {16}, torch::kLong)}, o);
}

namespace {

// Linear + tanh + Linear, squared error, SGD with momentum; gradients large enough that norm
// clipping at 0.5 changes them.
struct ClipNet : LightningModule {
  ClipNet() : LightningModule("ClipNet") {
    fc1 = register_module("fc1", torch::nn::Linear(8, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 1));
  }
  StepOutput training_step(const Batch& b, int64_t) override {
    const auto d = fc2->forward(torch::tanh(fc1->forward(b.data))) - b.target;
    return (d * d).mean() * 10;
  }
  OptimizerConfig configure_optimizers() override {
    return std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

std::shared_ptr<ClipNet> train_clipped(const std::string& accelerator, const std::string& algorithm) {
  fulgur::testing::TempDir dir;
  torch::manual_seed(7);
  auto net = std::make_shared<ClipNet>();
  Trainer t(TrainerOptions()
                .accelerator(accelerator)
                .devices(1)
                .max_epochs(1)
                .gradient_clip_val(0.5)
                .gradient_clip_algorithm(algorithm)
                .default_root_dir(dir.path)
                .enable_progress_bar(false)
                .enable_checkpointing(false)
                .logger(false)
                .num_sanity_val_steps(0));
  t.fit(*net, std::make_shared<DataLoader>(fulgur::testing::regression_data(80), DataLoaderOptions(8)));
  return net;
}

}  // namespace

// fulgur's own gradient clipping (gradient_clip_val, by norm and by value) keeps a training step
// on XLA: the norms (aten::norm), the clamp of the scale and the clamp of the values lower, and
// nothing runs on the host. 10 steps end with the CPU's parameters.
TEST(XlaOps, GradientClippingStaysOnXla) {
  for (const std::string algorithm : {"norm", "value"}) {
    SCOPED_TRACE(algorithm);
    const auto cpu = train_clipped("cpu", algorithm);
    const xla::BackendMetrics before = xla::metrics();
    const auto lazy = train_clipped("xla", algorithm);
    EXPECT_EQ(new_fallbacks(before, {}), "") << xla::metrics_report();
    EXPECT_GT(xla::metrics().xla_executions, before.xla_executions);
    const auto a = cpu->named_parameters(), b = lazy->named_parameters();
    for (const auto& p : a) EXPECT_TRUE(torch::allclose(b[p.key()], p.value(), 1e-5, 1e-5)) << p.key();
  }
}

TEST(StableHlo, ReductionsComparisonsReluAndThresholdBackward) {
  const std::string ir = R"IR(
graph(%a : Tensor, %g : Tensor, %i : Tensor, %j : Tensor, %th : int):
  %none : NoneType = prim::Constant()
  %true : bool = prim::Constant[value=1]()
  %false : bool = prim::Constant[value=0]()
  %d0 : int[] = prim::Constant[value=[0]]()
  %d02 : int[] = prim::Constant[value=[0, -1]]()
  %f64 : int = prim::Constant[value=7]()
  %s0 : Tensor = aten::sum(%a, %d0, %true, %none)
  %s02 : Tensor = aten::sum(%a, %d02, %false, %none)
  %sall : Tensor = aten::sum(%a, %none)
  %sd : Tensor = aten::sum(%a, %f64)
  %mall : Tensor = aten::mean(%a, %none)
  %m0 : Tensor = aten::mean(%a, %d0, %false, %none)
  %eq : Tensor = aten::eq(%i, %j)
  %si : Tensor = aten::sum(%eq, %none)
  %r : Tensor = aten::relu(%a)
  %tb : Tensor = aten::threshold_backward(%g, %r, %th)
  return (%s0, %s02, %sall, %sd, %mall, %m0, %eq, %si, %r, %tb)
)IR";
  torch::manual_seed(3);
  const auto i = torch::randint(3, {2, 3, 4}, torch::kLong), j = torch::randint(3, {3, 4}, torch::kLong);
  check(ir, {torch::randn({2, 3, 4}), torch::randn({2, 3, 4}), i, j, int64_t{0}}, "[2,3,4]");
  check(ir, {torch::randn({5, 1, 7}), torch::randn({5, 1, 7}), torch::randint(2, {5, 1, 7}, torch::kLong),
             torch::randint(2, {7}, torch::kLong), int64_t{0}},
        "[5,1,7]");
}

// all and any of a whole tensor (float with zeros, NaN and inf, int, bool, empty: all true, any
// false) and torch::equal (fulgur's Lazy kernel: the sizes on the host, all(eq) on the device,
// one bool read back): equal, one element off, NaN (never equal), other sizes, empty.
TEST(XlaOps, AllAnyAndEqual) {
  Options forward;
  forward.backward = false;
  for (const auto& x : {torch::tensor({1.0f, NAN, -INFINITY}), torch::tensor({1.0f, 0.0f, 2.0f}), torch::zeros({2, 3}),
                        torch::tensor({{3, 1}, {0, 2}}), torch::tensor({true, true}), torch::tensor({false, true}),
                        torch::zeros({0, 4})}) {
    check_op("all of " + c10::str(x.sizes()) + c10::str(x.scalar_type()), [](const auto& v) { return v[0].all(); }, {x}, forward);
    check_op("any of " + c10::str(x.sizes()) + c10::str(x.scalar_type()), [](const auto& v) { return v[0].any(); }, {x}, forward);
  }
  const c10::Device dev = xla::backend().device();
  const auto a = torch::randn({4, 5});
  auto b = a.clone();
  b[2][3] = 7;
  auto with_nan = a.clone();
  with_nan[0][0] = NAN;
  const xla::BackendMetrics before = xla::metrics();
  EXPECT_TRUE(torch::equal(a.to(dev), a.clone().to(dev)));
  EXPECT_FALSE(torch::equal(a.to(dev), b.to(dev)));
  EXPECT_FALSE(torch::equal(with_nan.to(dev), with_nan.to(dev)));
  EXPECT_FALSE(torch::equal(a.to(dev), a.reshape({5, 4}).to(dev)));
  EXPECT_TRUE(torch::equal(torch::zeros({0, 2}).to(dev), torch::zeros({0, 2}).to(dev)));
  // Three values compared on the device, each read back as one bool; other sizes and empty
  // tensors are decided on the host.
  EXPECT_EQ(new_eager_ops(before), (std::map<std::string, int64_t>{{"aten::_local_scalar_dense", 3}}))
      << xla::metrics_report();
}

namespace {

// Self-attention with nn::MultiheadAttention's own parameters through
// F::multi_head_attention_forward with separate projection weights (the rows of in_proj_weight
// for q, k and v): the same products as the module's forward, without its torch::equal checks
// of query, key and value (docs/GUIDE.md).
torch::Tensor self_attention(torch::nn::MultiheadAttentionImpl& mha, const torch::Tensor& x) {
  namespace F = torch::nn::functional;
  const int64_t e = mha.options.embed_dim();
  const torch::Tensor& w = mha.in_proj_weight;
  return std::get<0>(F::multi_head_attention_forward(
      x, x, x,
      F::MultiheadAttentionForwardFuncOptions(e, mha.options.num_heads(), w, mha.in_proj_bias, mha.bias_k, mha.bias_v,
                                              mha.options.add_zero_attn(), mha.options.dropout(),
                                              mha.out_proj->weight, mha.out_proj->bias)
          .training(mha.is_training())
          .need_weights(false)
          .use_separate_proj_weight(true)
          .q_proj_weight(w.slice(0, 0, e))
          .k_proj_weight(w.slice(0, e, 2 * e))
          .v_proj_weight(w.slice(0, 2 * e))));
}

}  // namespace

// nn::MultiheadAttention trains on xla as on the CPU. Its C++ forward compares query with key
// and key with value by value (torch::equal, where Python's compares identities), so each
// forward reads two bools back from the device; the workaround of self_attention() reads none
// and gives the same losses.
TEST(XlaOps, MultiheadAttentionTrainsWithTwoHostReadsPerForwardOrNoneWithSeparateProjections) {
  struct Net : torch::nn::Module {
    Net() { mha = register_module("mha", torch::nn::MultiheadAttention(torch::nn::MultiheadAttentionOptions(8, 2))); }
    torch::nn::MultiheadAttention mha{nullptr};
  };
  const auto x = torch::randn({5, 3, 8});  // [T, B, E]
  const int steps = 3;
  const auto module_reads = check_training("the module's forward", [] { return std::make_shared<Net>(); },
                                           [](torch::nn::Module& m, const torch::Tensor& v) {
                                             const auto out = std::get<0>(static_cast<Net&>(m).mha->forward(v, v, v));
                                             return (out - 0.5).square().mean();
                                           },
                                           x, steps);
  EXPECT_EQ(module_reads, (std::map<std::string, int64_t>{{"aten::_local_scalar_dense", 2 * steps}}));
  const auto workaround_reads = check_training("separate projections", [] { return std::make_shared<Net>(); },
                                               [](torch::nn::Module& m, const torch::Tensor& v) {
                                                 const auto out = self_attention(*static_cast<Net&>(m).mha, v);
                                                 return (out - 0.5).square().mean();
                                               },
                                               x, steps);
  EXPECT_TRUE(workaround_reads.empty()) << xla::metrics_report();
  torch::manual_seed(0);
  Net net;
  EXPECT_TRUE(torch::allclose(self_attention(*net.mha, x), std::get<0>(net.mha->forward(x, x, x)), 1e-6, 1e-6));
}
