// SPDX-License-Identifier: Apache-2.0
// Per-op tests of the elementwise rules (rules/elementwise.cpp): arithmetic, unary math, comparisons,
// where, masked_fill, clamp, bitwise ops, gelu, pow.
// Tolerances and method: xla_rules/graphs.h and xla_rules/lazy_ops.h.

#include "xla_rules/lazy_ops.h"
#include "xla_rules/graphs.h"

using namespace xla_rules;
using torch::indexing::None;
using torch::indexing::Slice;

// sigmoid_backward, sgn for abs): several shapes, float32 and bfloat16, and the edge values.
TEST(XlaOps, UnaryMathAndItsBackwards) {
  torch::manual_seed(1);
  const std::vector<std::pair<std::string, Fn>> ops = {
      {"tanh", [](const auto& x) { return x[0].tanh(); }},
      {"sigmoid", [](const auto& x) { return x[0].sigmoid(); }},
      {"exp", [](const auto& x) { return x[0].exp(); }},
      {"log", [](const auto& x) { return (x[0].abs() + 0.1).log(); }},
      {"rsqrt", [](const auto& x) { return (x[0].abs() + 0.1).rsqrt(); }},
      {"neg and abs", [](const auto& x) { return -x[0].abs() * 3; }},
  };
  for (const auto& [name, f] : ops) {
    for (const std::vector<int64_t>& shape : {std::vector<int64_t>{}, {7}, {3, 4, 5}}) {
      check_op(name + " " + c10::str(shape), f, {torch::randn(shape) * 3});
      check_op(name + " bf16 " + c10::str(shape), f, {(torch::randn(shape) * 3).to(torch::kBFloat16)}, bf16_options());
    }
  }
  // Edge values without gradients (the derivative at ±inf and NaN is NaN on both sides, but
  // libtorch's log at 0 and exp at inf meet inf - inf in the backward differently).
  Options forward_only;
  forward_only.backward = false;
  for (const auto& [name, f] : std::vector<std::pair<std::string, Fn>>{
           {"tanh", [](const auto& x) { return x[0].tanh(); }},
           {"sigmoid", [](const auto& x) { return x[0].sigmoid(); }},
           {"exp", [](const auto& x) { return x[0].exp(); }},
           {"log", [](const auto& x) { return x[0].log(); }},
           {"rsqrt", [](const auto& x) { return x[0].rsqrt(); }},
           {"abs", [](const auto& x) { return x[0].abs(); }},
           {"neg", [](const auto& x) { return -x[0]; }},
           {"sgn", [](const auto& x) { return x[0].sgn(); }}}) {
    check_op(name + " of edge values", f, {edges()}, forward_only);
    Options bf16 = bf16_options(forward_only);
    check_op(name + " of edge values, bf16", f, {edges(torch::kBFloat16)}, bf16);
  }
}

// lt, le, gt, ge, ne, eq: tensor against tensor (broadcasting both ways), against a number,
// float against int (compared in the promoted type), ties, ±inf and NaN (only ne is true).
TEST(XlaOps, ComparisonsBroadcastPromoteAndTreatNanAsIeee) {
  torch::manual_seed(2);
  Options o;
  o.backward = false;
  const std::vector<std::pair<std::string, std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&)>>> ops =
      {{"lt", [](const auto& a, const auto& b) { return a < b; }},  {"le", [](const auto& a, const auto& b) { return a <= b; }},
       {"gt", [](const auto& a, const auto& b) { return a > b; }},  {"ge", [](const auto& a, const auto& b) { return a >= b; }},
       {"ne", [](const auto& a, const auto& b) { return a != b; }}, {"eq", [](const auto& a, const auto& b) { return a == b; }}};
  for (const auto& [name, cmp] : ops) {
    const Fn tensors = [cmp = cmp](const auto& x) { return cmp(x[0], x[1]); };
    // Ties: integers drawn from a small range, as floats.
    check_op(name + " [4,5] with [5]", tensors,
             {torch::randint(3, {4, 5}).to(torch::kFloat), torch::randint(3, {5}).to(torch::kFloat)}, o);
    check_op(name + " [3,1] with [1,4]", tensors, {torch::randn({3, 1}), torch::randn({1, 4})}, o);
    check_op(name + " edges with edges reversed", tensors, {edges(), edges().flip(0)}, o);
    check_op(name + " bf16 edges with float32", tensors, {edges(torch::kBFloat16), edges().flip(0)}, o);
    check_op(name + " int64 with float32", tensors,
             {torch::tensor({1, 2, 3, -4}, torch::kLong), torch::tensor({1.5, 2.0, -kInf, kNan}, torch::kFloat)}, o);
    check_op(name + " with a number", [cmp = cmp](const auto& x) { return cmp(x[0], torch::scalar_tensor(0.5)); },
             {edges()}, o);
    check_op(name + " with a number, via Scalar", [name = name](const auto& x) {
      return name == "lt"   ? x[0].lt(0.5)
             : name == "le" ? x[0].le(0.5)
             : name == "gt" ? x[0].gt(0.5)
             : name == "ge" ? x[0].ge(0.5)
             : name == "ne" ? x[0].ne(0.5)
                            : x[0].eq(0.5);
    }, {edges()}, o);
  }
}

// maximum, minimum (NaN wins, as in torch.maximum) and clamp: both bounds, one bound (clamp_min;
// clamp(max=) is aten::clamp), min > max, NaN and ±inf. Forward only here: the backwards of
// maximum, minimum, clamp_min and clamp(max=) call where and are tested with it
// (XlaOps.WhereBroadcastsPromotesAndItsBackward), clamp's with both bounds calls logical_and_
// too (XlaOps.BitwiseAndLogicalAndOr). Tensor bounds (clamp.Tensor) have no lazy node.
TEST(XlaOps, MaximumMinimumAndClampPropagateNan) {
  torch::manual_seed(3);
  Options o;
  o.backward = false;
  check_op("maximum", [](const auto& x) { return torch::maximum(x[0], x[1]); }, {edges(), edges().flip(0)}, o);
  check_op("minimum", [](const auto& x) { return torch::minimum(x[0], x[1]); }, {edges(), edges().flip(0)}, o);
  check_op("maximum [3,4] with [4]", [](const auto& x) { return torch::maximum(x[0], x[1]); },
           {torch::randn({3, 4}), torch::randn({4})}, o);
  check_op("clamp(-0.5, 0.5)", [](const auto& x) { return x[0].clamp(-0.5, 0.5); }, {edges()}, o);
  check_op("clamp(min=-0.5)", [](const auto& x) { return x[0].clamp_min(-0.5); }, {edges()}, o);
  check_op("clamp(max=0.5)", [](const auto& x) { return x[0].clamp(std::nullopt, 0.5); }, {edges()}, o);
  check_op("clamp with min > max", [](const auto& x) { return x[0].clamp(1.0, -1.0); }, {edges()}, o);
  check_op("clamp bf16", [](const auto& x) { return x[0].clamp(-0.5, 2.0); }, {edges(torch::kBFloat16)},
           bf16_options(o));
  check_op("clamp of int64", [](const auto& x) { return x[0].clamp(-2, 3); },
           {torch::arange(-5, 6, torch::kLong)}, o);
}

// masked_fill with a number (-inf, as attention masks use it, and a finite one) and a 0-d
// tensor value, a mask broadcast over leading dims, and its backward (the gradient masked).
TEST(XlaOps, MaskedFillAndItsBackward) {
  torch::manual_seed(4);
  const auto causal = torch::ones({4, 4}).triu(1).to(torch::kBool);
  check_op("-inf above the diagonal, then softmax", [&](const auto& x) {
    return torch::softmax(x[0].masked_fill(causal.to(x[0].device()), -kInf), -1);
  }, {torch::randn({2, 4, 4})});
  check_op("a number", [](const auto& x) { return x[0].masked_fill(x[1], 7.5); },
           {torch::randn({3, 5}), torch::randn({3, 5}) > 0});
  check_op("a 0-d tensor value, mask [5] over [3, 5]",
           [](const auto& x) { return x[0].masked_fill(x[1], torch::scalar_tensor(-2.0).to(x[0].device())); },
           {torch::randn({3, 5}), torch::randn({5}) > 0});
  check_op("bf16", [](const auto& x) { return x[0].masked_fill(x[1], -1e4); },
           {torch::randn({3, 5}).to(torch::kBFloat16), torch::randn({3, 5}) > 0}, bf16_options());
}

// where: same shapes, a condition and operands broadcast against each other, a number as the
// other operand (where.ScalarOther wraps it), self and other of different dtypes (promoted),
// ±inf and NaN passed through untouched, bfloat16; with its backward (where with zeros, on each
// operand's gradient, summed over the broadcast dims); the backwards of maximum, minimum,
// clamp_min and clamp(max=), which call where; and where in a graph kept on TorchScript.
TEST(XlaOps, WhereBroadcastsPromotesAndItsBackward) {
  torch::manual_seed(6);
  check_op("same shapes", [](const auto& x) { return torch::where(x[2] > 0, x[0], x[1]); },
           {torch::randn({4, 5}), torch::randn({4, 5}), torch::randn({4, 5})}, [] {
             Options o;
             o.grad_inputs = 2;
             return o;
           }());
  check_op("condition [4, 1], self [4, 3], other [3]",
           [](const auto& x) { return torch::where(x[2].to(x[0].device()), x[0], x[1]); },
           {torch::randn({4, 3}), torch::randn({3}), torch::tensor({true, false, true, false}).reshape({4, 1})});
  check_op("a leaky activation: where(x > 0, x, 0.1 * x)",
           [](const auto& x) { return torch::where(x[0] > 0, x[0], 0.1 * x[0]); }, {torch::randn({3, 7})});
  check_op("a number as other", [](const auto& x) { return torch::where(x[0] < 0.5, x[0], -3.0); },
           {torch::randn({2, 3, 4})});
  check_op("edges through either side", [](const auto& x) { return torch::where(x[0] >= 0, x[0], x[1]); },
           {edges(), edges().flip(0)});
  Options forward;
  forward.backward = false;
  check_op("float self, int64 other", [](const auto& x) { return torch::where(x[0] > 0, x[0], x[1]); },
           {torch::randn({6}), torch::arange(6, torch::kLong)}, forward);
  check_op("int64 self and other", [](const auto& x) { return torch::where(x[0] > 2, x[0], x[1]); },
           {torch::arange(6, torch::kLong), torch::full({6}, -1, torch::kLong)}, forward);
  check_op("bf16", [](const auto& x) { return torch::where(x[0] > 0, x[0], x[1]); },
           {torch::randn({3, 5}).to(torch::kBFloat16), torch::randn({3, 5}).to(torch::kBFloat16)}, bf16_options());
  // Backwards that call where (random values: no ties between the operands or with the bounds).
  check_op("maximum", [](const auto& x) { return torch::maximum(x[0], x[1]); }, {torch::randn({4, 3}), torch::randn({3})});
  check_op("minimum", [](const auto& x) { return torch::minimum(x[0], x[1]); }, {torch::randn({4, 3}), torch::randn({4, 3})});
  check_op("clamp_min", [](const auto& x) { return x[0].clamp_min(0.2); }, {torch::randn({5, 4})});
  check_op("clamp(max=)", [](const auto& x) { return x[0].clamp_max(-0.1); }, {torch::randn({5, 4})});
  // A graph with where and an op the emitter does not lower (cos) stays on TorchScript, which
  // runs fulgur's where node as aten::where.
  const auto a = torch::randn({6, 4}), b = torch::randn({4});
  const xla::BackendMetrics before = xla::metrics();
  const torch::Tensor on_ts = torch::where(a.to(xla::backend().device()) > 0, a.to(xla::backend().device()).cos(),
                                           b.to(xla::backend().device()));
  xla::mark_step();
  EXPECT_GT(xla::metrics().xla_fallbacks.count("aten::cos"), 0u) << "the graph should have stayed on TorchScript";
  EXPECT_GT(xla::metrics().ts_fallback_executions, before.ts_fallback_executions);
  expect_close(on_ts.cpu(), torch::where(a > 0, a.cos(), b), {}, "where on TorchScript");
}

// bitwise_and and bitwise_or of bools and of int64 (broadcast), and logical_and / logical_or
// (fulgur's Lazy kernels: bitwise ops of x != 0) of floats, of bools and mixed, as a padding
// mask and a causal one combine; clamp with both bounds, whose backward calls logical_and_.
TEST(XlaOps, BitwiseAndLogicalAndOr) {
  torch::manual_seed(9);
  Options forward;
  forward.backward = false;
  const auto p = torch::randn({4, 5}) > 0, q = torch::randn({5}) > 0;
  check_op("bitwise_and bool", [](const auto& x) { return torch::bitwise_and(x[0], x[1]); }, {p, q}, forward);
  check_op("bitwise_or bool", [](const auto& x) { return torch::bitwise_or(x[0], x[1]); }, {p, q}, forward);
  const auto i = torch::randint(-8, 8, {3, 4}, torch::kLong), j = torch::randint(-8, 8, {4}, torch::kLong);
  check_op("bitwise_and int64", [](const auto& x) { return torch::bitwise_and(x[0], x[1]); }, {i, j}, forward);
  check_op("bitwise_or int64", [](const auto& x) { return torch::bitwise_or(x[0], x[1]); }, {i, j}, forward);
  const auto f = torch::tensor({0.0f, -0.0f, 1.0f, NAN, -2.0f, 0.0f}), g = torch::tensor({1.0f, 1.0f, 0.0f, 1.0f, 3.0f, 0.0f});
  check_op("logical_and floats", [](const auto& x) { return torch::logical_and(x[0], x[1]); }, {f, g}, forward);
  check_op("logical_or floats", [](const auto& x) { return torch::logical_or(x[0], x[1]); }, {f, g}, forward);
  check_op("logical_and float and bool", [](const auto& x) { return torch::logical_and(x[0], x[1]); },
           {f, torch::tensor({true, true, true, true, false, true})}, forward);
  check_op("a causal mask or a padding mask", [](const auto& x) {
    const auto causal = torch::ones({5, 5}, x[0].options().dtype(torch::kBool)).triu(1);
    return torch::logical_or(causal, x[0].view({2, 1, 5}));
  }, {torch::tensor({{false, false, false, true, true}, {false, false, false, false, true}})}, forward);
  check_op("in place: logical_and_", [](const auto& x) {
    auto m = x[0] > 0;
    m.logical_and_(x[0] < 1);
    return m;
  }, {torch::randn({3, 4})}, forward);
  check_op("clamp(-0.5, 0.5) and its backward", [](const auto& x) { return x[0].clamp(-0.5, 0.5); }, {torch::randn({5, 4})});
}

TEST(StableHlo, ArithmeticBroadcastsAndConvertsScalarsAsLibtorch) {
  // add with an int alpha from the graph's inputs (as the lazy lowering passes it), sub with a
  // constant alpha, a float input and a 0-d float64 tensor as operands of float32 tensors.
  const std::string ir = R"IR(
graph(%a : Tensor, %b : Tensor, %s : Tensor, %alpha : int, %f : float):
  %c : float = prim::Constant[value=2.5]()
  %x : Tensor = aten::add(%a, %b, %alpha)
  %y : Tensor = aten::sub(%x, %s, %c)
  %z : Tensor = aten::mul(%y, %f)
  %w : Tensor = aten::div(%z, %b)
  %m : Tensor = aten::mul(%a, %s)
  %q : Tensor = aten::sqrt(%m)
  %u : Tensor = aten::addcmul(%a, %b, %b, %f)
  %v : Tensor = aten::addcdiv(%a, %b, %m, %alpha)
  return (%x, %y, %z, %w, %q, %u, %v)
)IR";
  torch::manual_seed(0);
  const auto s = torch::scalar_tensor(0.75, torch::kDouble);
  check(ir, {torch::rand({4, 5}) + 0.5, torch::rand({5}) + 0.5, s, int64_t{3}, 0.3}, "[4,5] with [5]");
  check(ir, {torch::rand({2, 3, 4}) + 0.5, torch::rand({3, 1}) + 0.5, s, int64_t{-2}, -1.5}, "[2,3,4] with [3,1]");
  check(ir, {torch::rand({3}) + 0.5, torch::rand({2, 3}) + 0.5, s, int64_t{1}, 2.0}, "[3] with [2,3]");
}

TEST(StableHlo, TypePromotionOfMixedOperands) {
  // int64 + float32 -> float32; int64 / int64 -> float32 (true division); int64 tensor * a
  // float number -> float32; int64 tensor + int number stays int64; sqrt of int64 -> float32.
  const std::string ir = R"IR(
graph(%i : Tensor, %j : Tensor, %f : Tensor, %n : int, %x : float):
  %one : int = prim::Constant[value=1]()
  %a : Tensor = aten::add(%i, %f, %one)
  %d : Tensor = aten::div(%i, %j)
  %m : Tensor = aten::mul(%i, %x)
  %k : Tensor = aten::add(%i, %n, %one)
  %r : Tensor = aten::sqrt(%j)
  %e : Tensor = aten::eq(%i, %f)
  %g : Tensor = aten::eq(%i, %n)
  return (%a, %d, %m, %k, %r, %e, %g)
)IR";
  const auto i = torch::tensor(std::vector<int64_t>{1, 2, 3, int64_t{1} << 40}),
             j = torch::tensor(std::vector<int64_t>{4, 3, 2, 7});
  check(ir, {i, j, torch::tensor({1.0f, 2.5f, 3.0f, -1.0f}), int64_t{2}, 0.5}, "int64 with float32");
}

TEST(StableHlo, GeluAndItsBackwardBothApproximations) {
  const std::string ir = R"IR(
graph(%x : Tensor, %g : Tensor):
  %none : str = prim::Constant[value="none"]()
  %tanh : str = prim::Constant[value="tanh"]()
  %y : Tensor = aten::gelu(%x, %none)
  %gy : Tensor = aten::gelu_backward(%g, %x, %none)
  %t : Tensor = aten::gelu(%x, %tanh)
  %gt : Tensor = aten::gelu_backward(%g, %x, %tanh)
  return (%y, %gy, %t, %gt)
)IR";
  torch::manual_seed(6);
  // XLA:CPU's tanh is not libtorch's (Sleef's): the tanh form's derivative, where two terms
  // nearly cancel, differs by up to 2.5e-6 absolute; 5e-6 absolute here.
  const Tolerance tol{1e-5, 5e-6};
  check(ir, {torch::randn({4, 3, 8}) * 3, torch::randn({4, 3, 8})}, "[4,3,8]", tol);
  check(ir, {torch::linspace(-6, 6, 49), torch::ones({49})}, "[-6, 6]", tol);
}

TEST(StableHlo, PowOfNegativeBasesAndTensorExponents) {
  // x.pow(2) and its backward's x.pow(1.0) as the lazy lowering passes them (number exponents),
  // on negative bases too; a tensor exponent of a positive base.
  const std::string ir = R"IR(
graph(%x : Tensor, %p : Tensor, %e : Tensor):
  %two : int = prim::Constant[value=2]()
  %one : float = prim::Constant[value=1.]()
  %a : Tensor = aten::pow(%x, %two)
  %b : Tensor = aten::pow(%x, %one)
  %c : Tensor = aten::pow(%p, %e)
  return (%a, %b, %c)
)IR";
  torch::manual_seed(13);
  check(ir, {torch::randn({4, 5}) * 3, torch::rand({4, 5}) + 0.1, torch::randn({5})}, "[4,5]");
}

// clamp with tensor bounds (clamp.Tensor, clamp_min.Tensor, clamp_max.Tensor; fulgur's Lazy
// kernels make them maximum and minimum): bounds broadcast against self, both and one bound,
// with the backwards (to self and to the bounds); NaN in self or a bound gives NaN, min above
// max gives max; float64, bfloat16 and int64. A layer whose output is clamped to learned
// bounds trains on xla as on the CPU with nothing left on the host.
TEST(XlaOps, ClampWithTensorBoundsAndItsBackward) {
  torch::manual_seed(23);
  const auto x = torch::randn({4, 5}) * 2, lo = torch::randn({5}) - 0.5, hi = torch::randn({4, 1}) + 0.5;
  check_op("both bounds", [](const auto& v) { return torch::clamp(v[0], v[1], v[2]); }, {x, lo, hi});
  check_op("min only", [](const auto& v) { return torch::clamp(v[0], v[1], std::nullopt); }, {x, lo});
  check_op("max only", [](const auto& v) { return torch::clamp(v[0], std::nullopt, v[1]); }, {x, hi});
  check_op("clamp_min", [](const auto& v) { return torch::clamp_min(v[0], v[1]); }, {x, lo});
  check_op("clamp_max", [](const auto& v) { return torch::clamp_max(v[0], v[1]); }, {x, hi});
  check_op("float64", [](const auto& v) { return torch::clamp(v[0], v[1], v[2]); },
           {x.to(torch::kDouble), lo.to(torch::kDouble), hi.to(torch::kDouble)});
  check_op("bf16", [](const auto& v) { return torch::clamp(v[0], v[1], v[2]); },
           {x.to(torch::kBFloat16), lo.to(torch::kBFloat16), hi.to(torch::kBFloat16)}, bf16_options());
  Options forward;
  forward.backward = false;
  const auto e = edges();
  check_op("NaN and inf in self", [](const auto& v) { return torch::clamp(v[0], v[1], v[2]); },
           {e, torch::full({12}, -1.0f), torch::full({12}, 2.0f)}, forward);
  check_op("NaN in a bound, min above max", [](const auto& v) { return torch::clamp(v[0], v[1], v[2]); },
           {torch::tensor({1.0f, 2.0f, 3.0f, 0.5f}), torch::tensor({NAN, 0.0f, 4.0f, 2.0f}),
            torch::tensor({5.0f, NAN, 1.0f, 1.0f})}, forward);
  check_op("int64", [](const auto& v) { return torch::clamp(v[0], v[1], v[2]); },
           {torch::arange(-4, 4), torch::full({8}, -2, torch::kLong), torch::tensor({3, 3, 3, 3, 1, 1, 1, 1})}, forward);

  // The bounds are read from the module's registry (the module mover replaces its tensors).
  struct Net : torch::nn::Module {
    Net() {
      fc = register_module("fc", torch::nn::Linear(6, 4));
      register_parameter("lo", torch::full({4}, -0.3));
      register_parameter("hi", torch::full({4}, 0.3));
    }
    torch::nn::Linear fc{nullptr};
  };
  const auto eager = check_training("a layer clamped to learned bounds", [] { return std::make_shared<Net>(); },
                                    [](torch::nn::Module& m, const torch::Tensor& x) {
                                      auto& net = static_cast<Net&>(m);
                                      const auto p = net.named_parameters(false);
                                      return (torch::clamp(net.fc->forward(x), p["lo"], p["hi"]) - 1).square().mean();
                                    },
                                    torch::randn({8, 6}));
  EXPECT_TRUE(eager.empty()) << xla::metrics_report();
}
