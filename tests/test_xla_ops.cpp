// SPDX-License-Identifier: Apache-2.0
// Per-op tests of the StableHLO lowering rules of the op families (src/xla/stablehlo/rules/) on
// the lazy device itself: each op, and what autograd traces for its backward, runs on eager CPU
// tensors and on xla tensors (the pjrt backend, the real CPU plugin), in the graphs libtorch's
// lazy core makes. Results and gradients must agree with eager libtorch's, and nothing may leave
// XLA: no graph kept on TorchScript (xla_fallbacks) and no op run eagerly on the host
// (eager_fallbacks), except where a test names an op the lazy core itself has no node for.
//
// Tolerances: float32 1e-5 relative + 1e-6 absolute (XLA's transcendental functions are not
// Sleef's; sums in another order); bfloat16 1e-2 relative + 1e-2 absolute (one rounding, 2^-8
// relative, where libtorch rounds an intermediate XLA keeps in float32). NaN where libtorch has
// NaN. Bool and integer results exactly.
//
// Each test runs in its own process (CTest), so the backend's counters start at zero.

#include "support.h"

#include "runtime/log.h"
#include "xla/stablehlo/lowering.h"
#include "xla/threefry.h"

#include <fulgur/xla/backend.h>
#include <fulgur/xla/random.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

using namespace fulgur;
using torch::indexing::None;
using torch::indexing::Slice;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNan = std::numeric_limits<double>::quiet_NaN();

struct Tolerance {
  double rtol = 1e-5;
  double atol = 1e-6;
};
const Tolerance kBf16{1e-2, 1e-2};

using Fn = std::function<torch::Tensor(const std::vector<torch::Tensor>&)>;

void expect_close(const torch::Tensor& got, const torch::Tensor& want, const Tolerance& tol, const std::string& what) {
  ASSERT_EQ(got.scalar_type(), want.scalar_type()) << what;
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  if (want.is_floating_point()) {
    EXPECT_TRUE(torch::allclose(got.to(torch::kDouble), want.to(torch::kDouble), tol.rtol, tol.atol, true))
        << what << ": largest difference " << (got.to(torch::kDouble) - want.to(torch::kDouble)).abs().nan_to_num(0).max().item<double>()
        << (want.numel() <= 64 ? "\ngot\n" + c10::str(got) + "\nwant\n" + c10::str(want) : "");
  } else {
    EXPECT_TRUE(torch::equal(got, want)) << what << "\ngot\n" << got << "\nwant\n" << want;
  }
}

// The ops that left XLA since `before`: graphs kept on TorchScript by op, ops run eagerly.
std::string new_fallbacks(const xla::BackendMetrics& before, const std::set<std::string>& allowed_eager) {
  const xla::BackendMetrics after = xla::metrics();
  std::string out;
  for (const auto& [op, count] : after.xla_fallbacks)
    if (!before.xla_fallbacks.count(op) || before.xla_fallbacks.at(op) != count) out += " on TorchScript: " + op;
  for (const auto& [op, count] : after.eager_fallbacks)
    if ((!before.eager_fallbacks.count(op) || before.eager_fallbacks.at(op) != count) && !allowed_eager.count(op))
      out += " eager: " + op;
  return out;
}

struct Options {
  Tolerance tol;
  // Whether the floating inputs require gradients: the output's backward (with an upstream
  // gradient of random values) runs too, and the gradients are compared.
  bool backward = true;
  // Ops the lazy core runs eagerly because it has no node for them (named by the test).
  std::set<std::string> allowed_eager;
  // With backward: how many leading floating inputs require gradients (the others are data,
  // such as a loss's target).
  size_t grad_inputs = SIZE_MAX;
};

// Runs `f` on `inputs` on the CPU and on xla copies of them, and compares the results (and the
// inputs' gradients) after a step mark; fails if anything left XLA.
void check_op(const std::string& label, const Fn& f, const std::vector<torch::Tensor>& inputs, const Options& o = {}) {
  SCOPED_TRACE(label);
  const c10::Device dev = xla::backend().device();
  std::vector<torch::Tensor> cpu, lazy;
  for (const auto& t : inputs) {
    const bool grad = o.backward && t.is_floating_point() && cpu.size() < o.grad_inputs;
    cpu.push_back(t.clone().requires_grad_(grad));
    lazy.push_back(t.to(dev).detach().requires_grad_(grad));
  }
  const torch::Tensor want = f(cpu);
  torch::Tensor upstream;
  if (o.backward) {
    upstream = torch::randn(want.sizes()).to(want.scalar_type());
    want.backward(upstream);
  }
  const xla::BackendMetrics before = xla::metrics();
  const torch::Tensor got_lazy = f(lazy);
  if (o.backward) got_lazy.backward(upstream.to(dev));
  xla::mark_step();
  expect_close(got_lazy.detach().cpu(), want.detach(), o.tol, label + ": result");
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!cpu[i].requires_grad()) continue;
    ASSERT_TRUE(lazy[i].grad().defined()) << label << ": no gradient of input " << i;
    expect_close(lazy[i].grad().cpu(), cpu[i].grad(), o.tol, label + ": gradient of input " + std::to_string(i));
  }
  EXPECT_EQ(new_fallbacks(before, o.allowed_eager), "") << xla::metrics_report();
  EXPECT_GT(xla::metrics().xla_executions, before.xla_executions) << "nothing ran on XLA";
}

Options bf16_options(Options o = {}) {
  o.tol = kBf16;
  return o;
}

// Values with the edges an elementwise op must get right: zeros of both signs, ±inf, NaN, ties.
torch::Tensor edges(torch::Dtype dtype = torch::kFloat) {
  return torch::tensor({0.0, -0.0, 1.0, -1.0, 0.5, 3.0, -20.0, 20.0, kInf, -kInf, kNan, 1.0}, torch::kDouble).to(dtype);
}

}  // namespace

// tanh, sigmoid, exp, log, rsqrt, neg, abs and their backwards (tanh_backward,
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

// topk along the last dim and along dim 0, largest and smallest, k of 1, some and all, on
// float32, bfloat16 and int64; its values and its indices each compared. NaN counts as the
// largest value (first with largest, last with smallest). Ties: only the values are compared (the
// order of tied indices is libtorch's kernel's choice; this lowering gives the smaller index
// first). Forward only: topk's backward scatters into zeros with aten::scatter, for which the
// lazy core has no node.
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

// upsample_nearest2d by whole factors, as nn::Upsample and F::interpolate call it: 2 x 2 by
// scale factors, 2 x 3 and 1 x 2 by output sizes, 4 x 4 by scale factors (libtorch's float
// source-index formula, which the rule checks gives a whole-factor repeat), bfloat16, and ±inf
// and NaN copied through; with its backward (each input's copies summed).
TEST(XlaOps, UpsampleNearestAndItsBackward) {
  torch::manual_seed(8);
  namespace F = torch::nn::functional;
  auto by_scale = [](double f) {
    return [f](const auto& x) {
      return F::interpolate(x[0], F::InterpolateFuncOptions().scale_factor(std::vector<double>{f, f}).mode(torch::kNearest));
    };
  };
  auto by_size = [](int64_t h, int64_t w) {
    return [h, w](const auto& x) {
      return F::interpolate(x[0], F::InterpolateFuncOptions().size(std::vector<int64_t>{h, w}).mode(torch::kNearest));
    };
  };
  check_op("scale 2", by_scale(2), {torch::randn({2, 3, 4, 5})});
  check_op("size 8 x 15 of 4 x 5", by_size(8, 15), {torch::randn({1, 2, 4, 5})});
  check_op("size 3 x 8 of 3 x 4", by_size(3, 8), {torch::randn({2, 1, 3, 4})});
  check_op("scale 4", by_scale(4), {torch::randn({1, 2, 3, 3})});
  check_op("bf16 scale 2", by_scale(2), {torch::randn({1, 2, 3, 4}).to(torch::kBFloat16)}, bf16_options());
  Options forward;
  forward.backward = false;
  check_op("edges", by_scale(2), {edges().reshape({1, 1, 3, 4})}, forward);
}

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

// max and min of a whole tensor (NaN if any is NaN), and max along a dim with its indices (the
// first of ties, the first NaN: metrics take an argmax so, since libtorch's lazy core has no node
// for argmax), in float32, bfloat16 and int64, keepdim both ways. min along a dim has no lazy
// node either (aten::min.dim runs eagerly).
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
      }
    }
    check_op("max of all " + name, [](const auto& v) { return v[0].max(); }, {x}, o);
    check_op("min of all " + name, [](const auto& v) { return v[0].min(); }, {x}, o);
    check_op("max of all but the NaN row " + name, [](const auto& v) { return v[0].slice(0, 2).max(); }, {x}, o);
  }
  check_op("argmax of logits, as a metric", [](const auto& v) { return std::get<1>(v[0].max(1)) == v[1]; },
           {torch::randn({16, 10}), torch::randint(10, {16}, torch::kLong)}, o);
}

// binary_cross_entropy (mean, sum, none; with weights; inputs at 0 and 1, where libtorch clamps
// the log at -100) and binary_cross_entropy_with_logits (log_sigmoid_forward, sigmoid), with
// their backwards.
TEST(XlaOps, BinaryCrossEntropyAndItsBackward) {
  torch::manual_seed(10);
  namespace F = torch::nn::functional;
  const auto p = torch::rand({6, 5}) * 0.98 + 0.01, y = torch::rand({6, 5});
  Options o;
  o.grad_inputs = 1;
  for (const auto& [name, reduction] : std::vector<std::pair<std::string, F::BinaryCrossEntropyFuncOptions::reduction_t>>{
           {"mean", torch::kMean}, {"sum", torch::kSum}, {"none", torch::kNone}}) {
    check_op("bce " + name, [reduction = reduction](const auto& x) {
      return F::binary_cross_entropy(x[0], x[1], F::BinaryCrossEntropyFuncOptions().reduction(reduction));
    }, {p, y}, o);
    check_op("bce weighted " + name, [reduction = reduction](const auto& x) {
      return F::binary_cross_entropy(x[0], x[1], F::BinaryCrossEntropyFuncOptions().reduction(reduction).weight(x[2]));
    }, {p, y, torch::rand({5})}, o);
  }
  Options forward_only;
  forward_only.backward = false;
  check_op("bce at 0 and 1", [](const auto& x) {
    return F::binary_cross_entropy(x[0], x[1], F::BinaryCrossEntropyFuncOptions().reduction(torch::kNone));
  }, {torch::tensor({0.0f, 1.0f, 0.0f, 1.0f, 0.5f}), torch::tensor({0.0f, 1.0f, 1.0f, 0.0f, 0.5f})}, forward_only);
  check_op("bce bf16", [](const auto& x) { return F::binary_cross_entropy(x[0], x[1]); },
           {p.to(torch::kBFloat16), y.to(torch::kBFloat16)}, bf16_options(o));
  check_op("bce with logits", [](const auto& x) { return F::binary_cross_entropy_with_logits(x[0], x[1]); },
           {torch::randn({6, 5}) * 4, y}, o);
  check_op("log_sigmoid", [](const auto& x) { return torch::log_sigmoid(x[0]); }, {torch::randn({6, 5}) * 10});
}

// smooth_l1_loss with beta 1, 0.5 and 0 (the L1 loss), each reduction, with its backward; values
// on both sides of beta and ties at ±beta.
TEST(XlaOps, SmoothL1LossAndItsBackward) {
  torch::manual_seed(11);
  namespace F = torch::nn::functional;
  const auto a = torch::randn({8, 3}) * 2, b = torch::randn({8, 3});
  for (double beta : {1.0, 0.5, 0.0}) {
    for (const auto& [name, reduction] : std::vector<std::pair<std::string, F::SmoothL1LossFuncOptions::reduction_t>>{
             {"mean", torch::kMean}, {"sum", torch::kSum}, {"none", torch::kNone}}) {
      check_op("beta " + std::to_string(beta) + " " + name, [beta, reduction = reduction](const auto& x) {
        return F::smooth_l1_loss(x[0], x[1], F::SmoothL1LossFuncOptions().reduction(reduction), beta);
      }, {a, b});
    }
  }
  check_op("ties at beta", [](const auto& x) {
    return F::smooth_l1_loss(x[0], x[1], F::SmoothL1LossFuncOptions().reduction(torch::kSum), 0.5);
  }, {torch::tensor({0.5f, -0.5f, 0.0f, 2.0f}), torch::zeros({4})});
  check_op("bf16", [](const auto& x) { return F::smooth_l1_loss(x[0], x[1]); },
           {a.to(torch::kBFloat16), b.to(torch::kBFloat16)}, bf16_options());
}

// Ops the lazy core has no node for, given Lazy kernels of fulgur's (src/xla/lazy_views.cpp)
// that compose them from lowered ops: nothing runs on the host any more.
TEST(XlaOps, MseLossArgmaxAndClampMaxStayOnXla) {
  torch::manual_seed(13);
  namespace F = torch::nn::functional;
  const auto a = torch::randn({8, 3}) * 2, b = torch::randn({8, 3});
  for (const auto& [name, reduction] : std::vector<std::pair<std::string, F::MSELossFuncOptions::reduction_t>>{
           {"mean", torch::kMean}, {"sum", torch::kSum}, {"none", torch::kNone}}) {
    check_op("mse_loss " + name, [reduction = reduction](const auto& x) {
      return F::mse_loss(x[0], x[1], F::MSELossFuncOptions().reduction(reduction));
    }, {a, b});
  }
  check_op("mse_loss bf16", [](const auto& x) { return F::mse_loss(x[0], x[1]); },
           {a.to(torch::kBFloat16), b.to(torch::kBFloat16)}, bf16_options());
  Options forward;
  forward.backward = false;
  // Ties (the first wins) and NaN (the first NaN wins), along each dim and over everything.
  const auto ties = torch::tensor({{1.0f, 3.0f, 3.0f}, {2.0f, 2.0f, -1.0f}, {0.0f, NAN, 5.0f}, {NAN, 1.0f, NAN}});
  for (const auto& x : {a, ties}) {
    check_op("argmax dim 1", [](const auto& t) { return t[0].argmax(1); }, {x}, forward);
    check_op("argmax dim 0 keepdim", [](const auto& t) { return t[0].argmax(0, true); }, {x}, forward);
    check_op("argmax of all", [](const auto& t) { return t[0].argmax(); }, {x}, forward);
    check_op("argmax of all keepdim", [](const auto& t) { return t[0].argmax(std::nullopt, true); }, {x}, forward);
  }
  check_op("argmax int", [](const auto& t) { return t[0].argmax(1); }, {torch::tensor({{1, 7, 7}, {4, 0, 4}})}, forward);
  check_op("accuracy as a metric computes it", [](const auto& t) {
    return t[0].argmax(1).eq(t[1]).to(torch::kFloat32).mean();
  }, {a, torch::tensor({0, 1, 2, 0, 1, 2, 0, 1})}, forward);
  // Forward only here: its backward calls where and is tested with it
  // (XlaOps.WhereBroadcastsPromotesAndItsBackward).
  check_op("clamp_max", [](const auto& x) { return x[0].clamp_max(0.5); }, {torch::tensor({-1.0f, 0.5f, 2.0f, NAN, INFINITY})},
           forward);
}

// avg_pool2d (kernel 2; kernel 3 stride 2 padding 1 with count_include_pad true and false; a
// divisor_override; a [C, H, W] input) and adaptive_avg_pool2d (to 1x1, which the lazy core
// writes as a mean; to 2x2; to 3x5 of 7x9, whose windows overlap and differ in size), with their
// backwards.
TEST(XlaOps, AveragePoolsAndTheirBackwards) {
  torch::manual_seed(12);
  namespace F = torch::nn::functional;
  const auto x = torch::randn({2, 3, 8, 8});
  check_op("avg_pool2d 2", [](const auto& v) { return F::avg_pool2d(v[0], F::AvgPool2dFuncOptions(2)); }, {x});
  for (bool include : {true, false}) {
    check_op(std::string("avg_pool2d 3/2/1, count_include_pad ") + (include ? "true" : "false"), [include](const auto& v) {
      return F::avg_pool2d(v[0], F::AvgPool2dFuncOptions(3).stride(2).padding(1).count_include_pad(include));
    }, {torch::randn({2, 3, 9, 7})});
  }
  check_op("avg_pool2d divisor_override 5", [](const auto& v) {
    return F::avg_pool2d(v[0], F::AvgPool2dFuncOptions({2, 3}).stride({1, 2}).divisor_override(5));
  }, {x});
  check_op("avg_pool2d [C, H, W]", [](const auto& v) { return F::avg_pool2d(v[0], F::AvgPool2dFuncOptions(2)); },
           {torch::randn({3, 6, 6})});
  check_op("avg_pool2d bf16", [](const auto& v) { return F::avg_pool2d(v[0], F::AvgPool2dFuncOptions(2)); },
           {x.to(torch::kBFloat16)}, bf16_options());
  for (const std::vector<int64_t>& size : {std::vector<int64_t>{1, 1}, {2, 2}, {3, 5}}) {
    check_op("adaptive_avg_pool2d to " + c10::str(size), [size](const auto& v) {
      return F::adaptive_avg_pool2d(v[0], F::AdaptiveAvgPool2dFuncOptions(size));
    }, {torch::randn({2, 3, 7, 9})});
  }
  check_op("adaptive_avg_pool2d bf16", [](const auto& v) {
    return F::adaptive_avg_pool2d(v[0], F::AdaptiveAvgPool2dFuncOptions({3, 3}));
  }, {x.to(torch::kBFloat16)}, bf16_options());
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

namespace {

// The uniform numbers the device generator gives a draw of `n` from `state`, by the host
// function (src/xla/threefry.h), as float32.
torch::Tensor host_uniform(const torch::Tensor& state, int64_t n, int digits = 24) {
  const auto key = static_cast<uint64_t>(state[0].item<int64_t>()), offset = static_cast<uint64_t>(state[1].item<int64_t>());
  torch::Tensor out = torch::empty({n});
  for (int64_t i = 0; i < n; ++i)
    out[i] = xla::random::uniform_from_word(xla::random::words(key, offset, static_cast<uint64_t>(i)).first, digits);
  return out;
}

torch::TensorOptions on_xla(torch::Dtype dtype = torch::kFloat) { return torch::TensorOptions(dtype).device(xla::backend().device()); }

}  // namespace

// The host generator is Random123's threefry2x32_20 (its known-answer vectors), and the device
// draws its bits exactly: rand of float32 and bfloat16 (24 and 8 significand bits of the same
// words), and randn within float32 rounding of the host's Box-Muller. Each draw advances the
// state's offset by its element count; nothing leaves XLA.
TEST(XlaOps, DeviceGeneratorDrawsTheHostThreefryBits) {
  using xla::random::threefry2x32;
  EXPECT_EQ(threefry2x32(0, 0, 0, 0), std::make_pair(0x6b200159u, 0x99ba4efeu));
  EXPECT_EQ(threefry2x32(0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff), std::make_pair(0x1cb996fcu, 0xbb002be7u));
  EXPECT_EQ(threefry2x32(0x13198a2e, 0x03707344, 0x243f6a88, 0x85a308d3), std::make_pair(0xc4923a9cu, 0x483df7a0u));

  xla::manual_seed(11);
  const torch::Tensor s0 = xla::rng_state();
  ASSERT_EQ(s0[1].item<int64_t>(), 0);
  const xla::BackendMetrics before = xla::metrics();
  torch::Tensor u = torch::rand({37, 3}, on_xla());
  torch::Tensor h = torch::rand({5, 7}, on_xla(torch::kBFloat16));
  torch::Tensor z = torch::randn({1000}, on_xla());
  xla::mark_step();
  EXPECT_TRUE(torch::equal(u.cpu().reshape({-1}), host_uniform(s0, 111))) << "float32 rand";
  torch::Tensor s1 = s0.clone();
  s1[1] = 111;
  EXPECT_TRUE(torch::equal(h.cpu().reshape({-1}), host_uniform(s1, 35, 8).to(torch::kBFloat16))) << "bfloat16 rand";
  const torch::Tensor s3 = xla::rng_state();
  EXPECT_EQ(s3[0].item<int64_t>(), s0[0].item<int64_t>());
  EXPECT_EQ(s3[1].item<int64_t>(), 111 + 35 + 1000);
  // The normals: Box-Muller of each element's two words, on the host in float32.
  const auto key = static_cast<uint64_t>(s0[0].item<int64_t>());
  torch::Tensor want = torch::empty({1000});
  for (int64_t i = 0; i < 1000; ++i) {
    const auto [w0, w1] = xla::random::words(key, 146, static_cast<uint64_t>(i));
    const float u1 = xla::random::uniform_from_word(w0, 24), u2 = xla::random::uniform_from_word(w1, 24);
    want[i] = std::sqrt(-2.0f * std::log(1.0f - u1)) * std::cos(u2 * static_cast<float>(2 * M_PI));
  }
  expect_close(z.cpu(), want, {1e-5, 1e-5}, "randn");
  EXPECT_EQ(new_fallbacks(before, {}), "") << xla::metrics_report();
  EXPECT_GT(xla::metrics().xla_executions, before.xla_executions);
}

// A graph kept on TorchScript (aten::cos has no rule) draws with the host kernels of the same
// generator: the same bits as XLA would, and the state advances the same way.
TEST(XlaOps, AGraphOnTorchScriptDrawsTheSameBits) {
  xla::manual_seed(5);
  const torch::Tensor s0 = xla::rng_state();
  const xla::BackendMetrics before = xla::metrics();
  torch::Tensor u = torch::rand({64}, on_xla());
  torch::Tensor c = u.cos();
  xla::mark_step();
  EXPECT_GT(xla::metrics().xla_fallbacks.count("aten::cos"), 0u) << "the graph should have stayed on TorchScript";
  EXPECT_GT(xla::metrics().ts_fallback_executions, before.ts_fallback_executions);
  EXPECT_TRUE(torch::equal(u.cpu(), host_uniform(s0, 64)));
  EXPECT_TRUE(torch::allclose(c.cpu(), host_uniform(s0, 64).cos()));
  EXPECT_EQ(xla::rng_state()[1].item<int64_t>(), 64);
}

// uniform_ (rand, rand_like, uniform_(from, to)) and normal_ (randn, randn_like, normal_(mean,
// std)) of a million elements have their distribution's mean and variance (5 standard errors),
// in float32 and bfloat16, all on XLA.
TEST(XlaOps, UniformAndNormalHaveTheirMomentsOnXla) {
  xla::manual_seed(1);
  const xla::BackendMetrics before = xla::metrics();
  const int64_t n = 1 << 20;
  const torch::Tensor like = torch::zeros({1024, 1024}, on_xla());
  struct Case {
    std::string what;
    torch::Tensor x;
    double mean, var;
  };
  std::vector<Case> cases = {
      {"rand_like", torch::rand_like(like), 0.5, 1.0 / 12},
      {"randn_like", torch::randn_like(like), 0.0, 1.0},
      {"uniform_(-2, 3)", torch::empty({n}, on_xla()).uniform_(-2, 3), 0.5, 25.0 / 12},
      {"normal_(1, 2)", torch::empty({n}, on_xla()).normal_(1, 2), 1.0, 4.0},
      {"bfloat16 rand", torch::rand({n}, on_xla(torch::kBFloat16)), 0.5 - 1.0 / 512, 1.0 / 12},
      {"bfloat16 randn", torch::randn({n}, on_xla(torch::kBFloat16)), 0.0, 1.0},
  };
  xla::mark_step();
  for (const Case& c : cases) {
    const torch::Tensor x = c.x.cpu().to(torch::kDouble);
    const double mean = x.mean().item<double>(), var = x.var().item<double>();
    // Standard errors of the mean (sqrt(var / n)) and of the variance (var * sqrt(2 / n) for a
    // normal; smaller for a uniform).
    EXPECT_NEAR(mean, c.mean, 5 * std::sqrt(c.var / n)) << c.what;
    EXPECT_NEAR(var, c.var, 5 * c.var * std::sqrt(2.0 / n) + 1e-3 * c.var) << c.what;
    if (c.what.find("rand") != std::string::npos && c.what.find("randn") == std::string::npos) {
      EXPECT_GE(x.min().item<double>(), c.what == "uniform_(-2, 3)" ? -2.0 : 0.0) << c.what;
      EXPECT_LT(x.max().item<double>(), c.what == "uniform_(-2, 3)" ? 3.0 : 1.0) << c.what;
    }
  }
  EXPECT_EQ(new_fallbacks(before, {}), "") << xla::metrics_report();
}

// Dropout (aten::native_dropout and its backward) on XLA: about 1 - p of the elements kept (5
// standard errors), each kept one scaled by 1 / (1 - p), and the gradient is the upstream
// gradient through the same mask, scaled alike. bernoulli draws with its probabilities.
TEST(XlaOps, DropoutKeepsOneMinusPScalesAndItsBackwardUsesTheSameMask) {
  xla::manual_seed(2);
  const xla::BackendMetrics before = xla::metrics();
  const double p = 0.3;
  const int64_t n = 200000;
  const torch::Tensor x = (torch::rand({n}) + 0.5).to(xla::backend().device()).requires_grad_();
  const torch::Tensor upstream = torch::randn({n});
  const torch::Tensor y = torch::dropout(x, p, /*train=*/true);
  y.backward(upstream.to(xla::backend().device()));
  const torch::Tensor probs = torch::full({n}, 0.2).to(xla::backend().device());
  const torch::Tensor b = torch::bernoulli(probs);
  const torch::Tensor bp = torch::empty({n}, on_xla()).bernoulli_(0.9);
  xla::mark_step();
  const torch::Tensor xc = x.detach().cpu(), yc = y.detach().cpu(), g = x.grad().cpu();
  const torch::Tensor kept = yc != 0;
  const double fraction = kept.to(torch::kDouble).mean().item<double>();
  EXPECT_NEAR(fraction, 1 - p, 5 * std::sqrt(p * (1 - p) / n));
  const float scale = static_cast<float>(1 / (1 - p));
  EXPECT_TRUE(torch::equal(yc, torch::where(kept, xc * scale, torch::zeros({n})))) << "kept elements scaled by 1 / (1 - p)";
  EXPECT_TRUE(torch::equal(g, torch::where(kept, upstream * scale, torch::zeros({n})))) << "the backward's mask is the forward's";
  for (const auto& [what, t, q] : {std::make_tuple("bernoulli(0.2)", b, 0.2), std::make_tuple("bernoulli_(0.9)", bp, 0.9)}) {
    const torch::Tensor c = t.cpu();
    EXPECT_TRUE(torch::equal(c, (c != 0).to(torch::kFloat))) << what << ": not only zeros and ones";
    EXPECT_NEAR(c.to(torch::kDouble).mean().item<double>(), q, 5 * std::sqrt(q * (1 - q) / n)) << what;
  }
  EXPECT_EQ(new_fallbacks(before, {}), "") << xla::metrics_report();
  EXPECT_GT(xla::metrics().xla_executions, before.xla_executions);
}

// The same seed gives the same bits, in one graph or across step marks; another seed or another
// rank gives other bits; a restored state gives the draws that followed it.
TEST(XlaOps, SameSeedSameBitsOtherSeedOrRankOtherBits) {
  auto draws = [] {
    torch::Tensor a = torch::rand({1000}, on_xla());
    xla::mark_step();
    torch::Tensor b = torch::dropout(torch::ones({1000}, on_xla()), 0.5, true);
    xla::mark_step();
    return std::make_pair(a.cpu(), b.cpu());
  };
  xla::manual_seed(3);
  const auto first = draws();
  EXPECT_FALSE(torch::equal(first.first, first.first.roll(1))) << "a draw of one value repeated";
  xla::manual_seed(3);
  const auto again = draws();
  EXPECT_TRUE(torch::equal(first.first, again.first));
  EXPECT_TRUE(torch::equal(first.second, again.second));
  xla::manual_seed(4);
  EXPECT_FALSE(torch::equal(first.first, draws().first)) << "another seed";
  {
    runtime::RankScope rank(1, 2);
    xla::manual_seed(3);
    EXPECT_FALSE(torch::equal(first.first, draws().first)) << "another rank";
  }
  xla::manual_seed(3);
  (void)torch::rand({10}, on_xla());
  const torch::Tensor state = xla::rng_state();
  const torch::Tensor next = torch::rand({1000}, on_xla()).cpu();
  xla::manual_seed(9);
  xla::set_rng_state(state);
  EXPECT_TRUE(torch::equal(next, torch::rand({1000}, on_xla()).cpu())) << "after set_rng_state";
  EXPECT_THROW(xla::set_rng_state(torch::zeros({3}, torch::kLong)), std::invalid_argument);
}

namespace {

// Linear, dropout(0.5), Linear, squared error, plain SGD; records each step's loss.
struct DropNet : LightningModule {
  DropNet() : LightningModule("DropNet") {
    fc1 = register_module("fc1", torch::nn::Linear(8, 32));
    fc2 = register_module("fc2", torch::nn::Linear(32, 1));
  }
  StepOutput training_step(const Batch& b, int64_t) override {
    const auto h = torch::dropout(torch::relu(fc1->forward(b.data)), 0.5, is_training());
    const auto d = fc2->forward(h) - b.target;
    const auto loss = (d * d).mean();
    losses.push_back(loss.detach());
    return loss;
  }
  OptimizerConfig configure_optimizers() override {
    return std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.05));
  }
  torch::Tensor recorded() const {
    std::vector<torch::Tensor> out;
    for (const auto& l : losses) out.push_back(l.cpu().reshape({1}));
    return torch::cat(out);
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  std::vector<torch::Tensor> losses;
};

// The losses of 2 epochs of DropNet on xla (10 steps each) with seed 5, resumed from `ckpt`
// when given; with `save_dir`, a checkpoint every 10 steps there.
torch::Tensor train_dropout(const std::string& ckpt = "", const std::string& save_dir = "") {
  fulgur::testing::TempDir dir;
  torch::manual_seed(7);
  DropNet net;
  std::vector<std::shared_ptr<Callback>> callbacks;
  if (!save_dir.empty())
    callbacks.push_back(std::make_shared<ModelCheckpoint>(
        ModelCheckpointOptions().dirpath(save_dir).every_n_train_steps(10).save_top_k(-1).filename("{step}")));
  Trainer t(TrainerOptions()
                .accelerator("xla")
                .devices(1)
                .max_epochs(2)
                .seed(5)
                .callbacks(callbacks)
                .default_root_dir(dir.path)
                .enable_progress_bar(false)
                .enable_checkpointing(!save_dir.empty())
                .logger(false)
                .num_sanity_val_steps(0));
  t.fit(net, std::make_shared<DataLoader>(fulgur::testing::regression_data(80), DataLoaderOptions(8)), nullptr, ckpt);
  return net.recorded();
}

}  // namespace

// A model with dropout trained on xla: two runs with the same seed have bit-identical losses (and
// their steps share graphs), a run resumed from a checkpoint continues with the losses of the
// uninterrupted run (the device generator's state is in the checkpoint), and nothing leaves XLA.
TEST(XlaOps, DropoutTrainingIsReproducibleAndResumesBitIdentically) {
  fulgur::testing::TempDir dir;
  const xla::BackendMetrics before = xla::metrics();
  const torch::Tensor a = train_dropout("", dir.path);
  EXPECT_EQ(new_fallbacks(before, {}), "") << xla::metrics_report();
  const int64_t compiled = xla::metrics().xla_graphs_compiled;
  const torch::Tensor b = train_dropout();
  // The generator's state is device data of a fixed shape, not a constant of each step: the
  // 20 steps share their graphs (each fit compiles its own anew, dropout or not).
  EXPECT_LT(xla::metrics().xla_graphs_compiled - compiled, 20) << "a graph per step";
  ASSERT_EQ(a.numel(), 20);
  EXPECT_TRUE(torch::equal(a, b)) << "two runs\n" << a << "\n" << b;
  std::string ckpt;
  for (const auto& f : std::filesystem::directory_iterator(dir.path))
    if (f.path().filename().string().find("step=10") != std::string::npos) ckpt = f.path().string();
  ASSERT_FALSE(ckpt.empty()) << "no checkpoint of step 10 in " << dir.path;
  const torch::Tensor resumed = train_dropout(ckpt);
  EXPECT_TRUE(torch::equal(resumed, a.slice(0, 10, 20))) << "resumed\n" << resumed << "\nuninterrupted\n" << a.slice(0, 10, 20);
}

// Every rule in the rule table (src/xla/stablehlo/rules/) has a test in this file: adding a rule
// without one fails here. The test that covers each kind is named beside it.
TEST(XlaOps, EveryRuleOfTheTableHasAPerOpTest) {
  const std::map<std::string, std::string> tested = {
      {"aten::tanh", "XlaOps.UnaryMathAndItsBackwards"},
      {"aten::sigmoid", "XlaOps.UnaryMathAndItsBackwards"},
      {"aten::exp", "XlaOps.UnaryMathAndItsBackwards"},
      {"aten::log", "XlaOps.UnaryMathAndItsBackwards"},
      {"aten::rsqrt", "XlaOps.UnaryMathAndItsBackwards"},
      {"aten::neg", "XlaOps.UnaryMathAndItsBackwards"},
      {"aten::abs", "XlaOps.UnaryMathAndItsBackwards"},
      {"aten::sgn", "XlaOps.UnaryMathAndItsBackwards"},
      {"aten::tanh_backward", "XlaOps.UnaryMathAndItsBackwards"},
      {"aten::sigmoid_backward", "XlaOps.UnaryMathAndItsBackwards"},
      {"aten::eq", "XlaOps.ComparisonsBroadcastPromoteAndTreatNanAsIeee"},
      {"aten::ne", "XlaOps.ComparisonsBroadcastPromoteAndTreatNanAsIeee"},
      {"aten::lt", "XlaOps.ComparisonsBroadcastPromoteAndTreatNanAsIeee"},
      {"aten::le", "XlaOps.ComparisonsBroadcastPromoteAndTreatNanAsIeee"},
      {"aten::gt", "XlaOps.ComparisonsBroadcastPromoteAndTreatNanAsIeee"},
      {"aten::ge", "XlaOps.ComparisonsBroadcastPromoteAndTreatNanAsIeee"},
      {"aten::maximum", "XlaOps.MaximumMinimumAndClampPropagateNan"},
      {"aten::minimum", "XlaOps.MaximumMinimumAndClampPropagateNan"},
      {"aten::clamp", "XlaOps.MaximumMinimumAndClampPropagateNan"},
      {"aten::clamp_min", "XlaOps.MaximumMinimumAndClampPropagateNan"},
      {"aten::masked_fill", "XlaOps.MaskedFillAndItsBackward"},
      {"aten::where", "XlaOps.WhereBroadcastsPromotesAndItsBackward"},
      {"aten::topk", "XlaOps.TopkLargestAndSmallestAlongEachDim"},
      {"aten::log_sigmoid_forward", "XlaOps.BinaryCrossEntropyAndItsBackward"},
      {"aten::log_sigmoid_backward", "XlaOps.BinaryCrossEntropyAndItsBackward"},
      {"aten::norm", "XlaOps.NormOfEveryOrderAndItsBackward"},
      {"aten::add", "StableHlo.ArithmeticBroadcastsAndConvertsScalarsAsLibtorch"},
      {"aten::sub", "StableHlo.ArithmeticBroadcastsAndConvertsScalarsAsLibtorch"},
      {"aten::mul", "StableHlo.ArithmeticBroadcastsAndConvertsScalarsAsLibtorch"},
      {"aten::div", "StableHlo.ArithmeticBroadcastsAndConvertsScalarsAsLibtorch"},
      {"aten::pow", "StableHlo.PowOfNegativeBasesAndTensorExponents"},
      {"aten::bitwise_and", "XlaOps.BitwiseAndLogicalAndOr"},
      {"aten::bitwise_or", "XlaOps.BitwiseAndLogicalAndOr"},
      {"aten::sqrt", "StableHlo.ArithmeticBroadcastsAndConvertsScalarsAsLibtorch"},
      {"aten::relu", "StableHlo.ReductionsComparisonsReluAndThresholdBackward"},
      {"aten::addcmul", "StableHlo.ArithmeticBroadcastsAndConvertsScalarsAsLibtorch"},
      {"aten::addcdiv", "StableHlo.ArithmeticBroadcastsAndConvertsScalarsAsLibtorch"},
      {"aten::ScalarImplicit", "XlaOps.NormOfEveryOrderAndItsBackward"},
      {"aten::zero", "StableHlo.ZeroCopiesViewsAndTransposes"},
      {"aten::zeros_like", "StableHlo.ZeroCopiesViewsAndTransposes"},
      {"aten::gelu", "StableHlo.GeluAndItsBackwardBothApproximations"},
      {"aten::gelu_backward", "StableHlo.GeluAndItsBackwardBothApproximations"},
      {"aten::detach_copy", "StableHlo.ZeroCopiesViewsAndTransposes"},
      {"aten::expand_copy", "StableHlo.ZeroCopiesViewsAndTransposes"},
      {"aten::_to_copy", "StableHlo.ZeroCopiesViewsAndTransposes"},
      {"aten::view_copy", "StableHlo.ZeroCopiesViewsAndTransposes"},
      {"aten::t_copy", "StableHlo.ZeroCopiesViewsAndTransposes"},
      {"aten::transpose_copy", "StableHlo.ZeroCopiesViewsAndTransposes"},
      {"prim::ListConstruct", "StableHlo.StackCatAndSelectCopy"},
      {"aten::stack", "StableHlo.StackCatAndSelectCopy"},
      {"aten::cat", "StableHlo.StackCatAndSelectCopy"},
      {"aten::select_copy", "StableHlo.StackCatAndSelectCopy"},
      {"aten::embedding", "StableHlo.EmbeddingGathersRows"},
      {"aten::embedding_dense_backward", "StableHlo.EmbeddingDenseBackwardAddsRepeatedIndicesAndSkipsPadding"},
      {"aten::native_layer_norm", "StableHlo.NativeLayerNormWithAndWithoutAffine"},
      {"aten::native_layer_norm_backward", "StableHlo.NativeLayerNormBackward"},
      {"aten::native_batch_norm", "StableHlo.BatchNormTrainsEvaluatesAndUpdatesItsRunningStatistics"},
      {"aten::native_batch_norm_backward", "StableHlo.BatchNormTrainsEvaluatesAndUpdatesItsRunningStatistics"},
      {"aten::convolution", "StableHlo.ConvolutionAndItsBackward"},
      {"aten::convolution_backward", "StableHlo.ConvolutionAndItsBackward"},
      {"aten::max_pool2d_with_indices", "StableHlo.MaxPoolWithIndicesAndItsBackward"},
      {"aten::max_pool2d_with_indices_backward", "StableHlo.MaxPoolWithIndicesAndItsBackward"},
      {"aten::threshold_backward", "StableHlo.AThresholdBeforeATiledMaxPoolIsAppliedAtThePoolsSize"},
      {"aten::mm", "StableHlo.MatmulsWithAlphaAndBeta"},
      {"aten::sum", "StableHlo.ReductionsComparisonsReluAndThresholdBackward"},
      {"aten::mean", "StableHlo.ReductionsComparisonsReluAndThresholdBackward"},
      {"aten::_log_softmax", "StableHlo.LogSoftmaxNllLossAndTheirBackwardsWithIgnoredTargets"},
      {"aten::_log_softmax_backward_data", "StableHlo.LogSoftmaxNllLossAndTheirBackwardsWithIgnoredTargets"},
      {"aten::nll_loss_forward", "StableHlo.LogSoftmaxNllLossAndTheirBackwardsWithIgnoredTargets"},
      {"aten::nll_loss_backward", "StableHlo.LogSoftmaxNllLossAndTheirBackwardsWithIgnoredTargets"},
      {"aten::_softmax", "StableHlo.SoftmaxAndItsBackward"},
      {"aten::_softmax_backward_data", "StableHlo.SoftmaxAndItsBackward"},
      {"aten::bmm", "StableHlo.MatmulsWithAlphaAndBeta"},
      {"aten::addmm", "StableHlo.MatmulsWithAlphaAndBeta"},
      {"aten::max", "XlaOps.MaxAndMinWithIndicesTiesAndNan"},
      {"aten::min", "XlaOps.MaxAndMinWithIndicesTiesAndNan"},
      {"aten::IntImplicit", "XlaOps.SlicingAndItsBackward"},
      {"aten::slice_copy", "XlaOps.SlicingAndItsBackward"},
      {"aten::slice_scatter", "XlaOps.SlicingAndItsBackward"},
      {"aten::select_scatter", "XlaOps.SlicingAndItsBackward"},
      {"aten::permute_copy", "XlaOps.PermuteSqueezeUnsqueezeAndTheirBackwards"},
      {"aten::squeeze_copy", "XlaOps.PermuteSqueezeUnsqueezeAndTheirBackwards"},
      {"aten::unsqueeze_copy", "XlaOps.PermuteSqueezeUnsqueezeAndTheirBackwards"},
      {"aten::clone", "XlaOps.TriuTrilAndTheirBackwards"},
      {"aten::expand", "XlaOps.TriuTrilAndTheirBackwards"},
      {"aten::index_select", "XlaOps.IndexSelect"},
      {"aten::triu", "XlaOps.TriuTrilAndTheirBackwards"},
      {"aten::tril", "XlaOps.TriuTrilAndTheirBackwards"},
      {"aten::binary_cross_entropy", "XlaOps.BinaryCrossEntropyAndItsBackward"},
      {"aten::binary_cross_entropy_backward", "XlaOps.BinaryCrossEntropyAndItsBackward"},
      {"aten::smooth_l1_loss", "XlaOps.SmoothL1LossAndItsBackward"},
      {"aten::smooth_l1_loss_backward", "XlaOps.SmoothL1LossAndItsBackward"},
      {"aten::avg_pool2d", "XlaOps.AveragePoolsAndTheirBackwards"},
      {"aten::avg_pool2d_backward", "XlaOps.AveragePoolsAndTheirBackwards"},
      {"aten::_adaptive_avg_pool2d", "XlaOps.AveragePoolsAndTheirBackwards"},
      {"aten::_adaptive_avg_pool2d_backward", "XlaOps.AveragePoolsAndTheirBackwards"},
      {"aten::upsample_nearest2d", "XlaOps.UpsampleNearestAndItsBackward"},
      {"aten::upsample_nearest2d_backward", "XlaOps.UpsampleNearestAndItsBackward"},
      {"aten::native_dropout_backward", "XlaOps.DropoutKeepsOneMinusPScalesAndItsBackwardUsesTheSameMask"},
      {"fulgur::rng_uniform", "XlaOps.DeviceGeneratorDrawsTheHostThreefryBits"},
      {"fulgur::rng_normal", "XlaOps.DeviceGeneratorDrawsTheHostThreefryBits"},
  };
  std::vector<std::string> listed;
  for (const auto& [kind, test] : tested) {
    listed.push_back(kind);
    // A test of this file must exist; a StableHlo one is in test_stablehlo.cpp.
    const std::string suite = test.substr(0, test.find('.')), name = test.substr(test.find('.') + 1);
    if (suite != "XlaOps") continue;
    bool found = false;
    const ::testing::TestSuite* here = ::testing::UnitTest::GetInstance()->current_test_suite();
    for (int i = 0; i < here->total_test_count(); ++i) found = found || here->GetTestInfo(i)->name() == name;
    EXPECT_TRUE(found) << kind << ": no test " << test;
  }
  EXPECT_EQ(fulgur::xla::stablehlo::rules().kinds(), listed);
}
