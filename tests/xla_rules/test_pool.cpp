// SPDX-License-Identifier: Apache-2.0
// Per-op tests of the pooling rules (rules/pool.cpp): max pool with indices, average and adaptive pools.
// Tolerances and method: xla_rules/graphs.h and xla_rules/lazy_ops.h.

#include "xla_rules/lazy_ops.h"
#include "xla_rules/graphs.h"

using namespace xla_rules;
using torch::indexing::None;
using torch::indexing::Slice;

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

// A max pool's shape case: the input's and output's sizes and the pool's window, written into
// an IR text's KERNEL, STRIDE and PADDING; `flag` is what the test checks of its lowering.
struct PoolCase {
  std::vector<int64_t> x;
  std::string kernel, stride, padding;
  std::vector<int64_t> y;
  bool flag;
};

// `ir` with the case's window written in, and a label naming the case.
std::pair<std::string, std::string> pool_text(const std::string& ir, const PoolCase& c) {
  std::string text = ir;
  for (const auto& [key, value] : {std::pair<std::string, std::string>{"KERNEL", c.kernel}, {"STRIDE", c.stride},
                                   {"PADDING", c.padding}})
    text = std::regex_replace(text, std::regex(key), value);
  return {text, "input " + c10::str(c.x) + " kernel " + c.kernel + " stride " + c.stride + " padding " + c.padding};
}

}  // namespace

TEST(StableHlo, MaxPoolWithIndicesAndItsBackward) {
  const std::string ir = R"IR(
graph(%x : Tensor, %g : Tensor):
  %kernel : int[] = prim::Constant[value=[KERNEL]]()
  %stride : int[] = prim::Constant[value=[STRIDE]]()
  %padding : int[] = prim::Constant[value=[PADDING]]()
  %dilation : int[] = prim::Constant[value=[1, 1]]()
  %false : bool = prim::Constant[value=0]()
  %y : Tensor, %i : Tensor = aten::max_pool2d_with_indices(%x, %kernel, %stride, %padding, %dilation, %false)
  %gx : Tensor = aten::max_pool2d_with_indices_backward(%g, %x, %kernel, %stride, %padding, %dilation, %false, %i)
  return (%y, %i, %gx)
)IR";
  torch::manual_seed(15);
  fulgur::xla::stablehlo::EmitOptions xla_cpu;
  xla_cpu.xla_cpu = true;
  // The generic rule and platform xla_cpu's packed float32 form.
  const std::vector<std::pair<std::string, fulgur::xla::stablehlo::EmitOptions>> forms = {{"generic", {}},
                                                                                        {"xla_cpu", xla_cpu}};
  // flag: the windows overlap (they keep the scatter; the others are a select).
  for (const PoolCase& c : {PoolCase{{4, 16, 28, 28}, "2, 2", "", "0, 0", {4, 16, 14, 14}, false},
                            PoolCase{{2, 3, 7, 9}, "3, 2", "2, 2", "1, 1", {2, 3, 4, 5}, true},
                            PoolCase{{3, 5, 6}, "3, 3", "1, 1", "0, 0", {3, 3, 4}, true},
                            // Padding, and rows and columns no window reaches (floor mode).
                            PoolCase{{2, 3, 7, 9}, "2, 3", "2, 3", "1, 1", {2, 3, 4, 3}, false},
                            PoolCase{{3, 8, 7}, "3, 3", "3, 3", "0, 0", {3, 2, 2}, false},
                            PoolCase{{2, 2, 12, 10}, "4, 5", "4, 5", "0, 0", {2, 2, 3, 2}, false}}) {
    const auto [text, with_window] = pool_text(ir, c);
    for (const auto& [form, options] : forms) {
      const std::string label = with_window + ", " + form;
      check(text, {torch::randn(c.x), torch::randn(c.y)}, label, {}, options);
      // Ties (values from a few levels): each window's first maximum, as libtorch picks it.
      check(text, {torch::randint(3, c.x).to(torch::kFloat), torch::randn(c.y)}, label + ", ties", {}, options);
      // Windows of -inf alone: the index of the first element.
      check(text, {torch::where(torch::rand(c.x) < 0.7, -std::numeric_limits<float>::infinity(), torch::randn(c.x)),
                   torch::randn(c.y)},
            label + ", -inf", {}, options);
      // Zeros of either sign (-0.0 and 0.0 tie): the first.
      check(text, {torch::where(torch::rand(c.x) < 0.5, -0.0f, 0.0f) * (torch::rand(c.x) < 0.8).to(torch::kFloat),
                   torch::randn(c.y)},
            label + ", signed zeros", {}, options);
      check(text, {torch::randint(3, c.x, torch::kDouble), torch::randn(c.y, torch::kDouble)}, label + ", float64 ties",
            {}, options);
      // NaNs of either sign, often several in a window: a NaN wins, of several the last.
      for (auto dtype : {torch::kFloat, torch::kDouble}) {
        const auto nan = torch::full(c.x, std::numeric_limits<double>::quiet_NaN(), dtype);
        const auto x = torch::where(torch::rand(c.x) < 0.3, torch::where(torch::rand(c.x) < 0.5, nan, -nan),
                                    torch::randn(c.x, dtype));
        check(text, {x, torch::randn(c.y, dtype)}, label + ", NaN " + c10::toString(dtype), {}, options);
      }
      const auto graph = parse(text);
      run_eager_and_type(*graph, {torch::randn(c.x), torch::randn(c.y)});
      const std::string module = emit_stablehlo(*graph, options).module;
      EXPECT_EQ(module.find("stablehlo.scatter") != std::string::npos, c.flag) << module;
      // XLA:CPU's form packs a float32 value and its index into one int64 for one reduce_window of
      // one result; the generic form reduces both in one variadic reduce_window.
      EXPECT_EQ(module.find("\"stablehlo.shift_left\"") != std::string::npos, options.xla_cpu) << module;
    }
  }
}

// A ReLU (or any threshold) before a max pool: threshold_backward(max_pool_backward(g, x), x, t).
// For pools whose windows do not overlap the emitter's graph pass (passes.h) thresholds g against
// the pooled maxima before the pool's backward, at the pool's output size; the results must be libtorch's exactly,
// ties, zeros of both signs, NaN and values at the threshold included.
TEST(StableHlo, AThresholdBeforeATiledMaxPoolIsAppliedAtThePoolsSize) {
  const std::string ir = R"IR(
graph(%x : Tensor, %g : Tensor, %t : float):
  %kernel : int[] = prim::Constant[value=[KERNEL]]()
  %stride : int[] = prim::Constant[value=[STRIDE]]()
  %padding : int[] = prim::Constant[value=[PADDING]]()
  %dilation : int[] = prim::Constant[value=[1, 1]]()
  %false : bool = prim::Constant[value=0]()
  %r : Tensor = aten::relu(%x)
  %y : Tensor, %i : Tensor = aten::max_pool2d_with_indices(%r, %kernel, %stride, %padding, %dilation, %false)
  %gy : Tensor = aten::max_pool2d_with_indices_backward(%g, %r, %kernel, %stride, %padding, %dilation, %false, %i)
  %gr : Tensor = aten::threshold_backward(%gy, %r, %t)
  %gx : Tensor = aten::threshold_backward(%gr, %x, %t)
  return (%y, %gr, %gx)
)IR";
  torch::manual_seed(17);
  // flag: the windows do not overlap (the threshold moves before the pool's backward).
  for (const PoolCase& c : {PoolCase{{4, 16, 28, 28}, "2, 2", "", "0, 0", {4, 16, 14, 14}, true},
                            PoolCase{{2, 3, 7, 9}, "2, 3", "2, 3", "1, 1", {2, 3, 4, 3}, true},
                            PoolCase{{3, 8, 7}, "3, 3", "3, 3", "0, 0", {3, 2, 2}, true},
                            PoolCase{{2, 3, 7, 9}, "3, 2", "2, 2", "1, 1", {2, 3, 4, 5}, false}}) {
    const auto [text, label] = pool_text(ir, c);
    const Tolerance exact{0, 0};
    for (double t : {0.0, 0.5, -1.0}) {
      const std::string at = label + ", threshold " + std::to_string(t);
      check(text, {torch::randn(c.x), torch::randn(c.y), t}, at, exact);
      // Ties, and values equal to the threshold.
      check(text, {torch::randint(-2, 3, c.x).to(torch::kFloat) * 0.5, torch::randn(c.y), t}, at + ", ties", exact);
      check(text, {torch::where(torch::rand(c.x) < 0.5, -0.0f, 0.0f), torch::randn(c.y), t}, at + ", signed zeros",
            exact);
      check(text,
            {torch::where(torch::rand(c.x) < 0.1, std::numeric_limits<float>::quiet_NaN(), torch::randn(c.x)),
             torch::randn(c.y), t},
            at + ", NaN", exact);
      check(text, {torch::randint(-2, 3, c.x, torch::kDouble), torch::randn(c.y, torch::kDouble), t},
            at + ", float64 ties", exact);
    }
    const auto graph = parse(text);
    run_eager_and_type(*graph, {torch::randn(c.x), torch::randn(c.y), 0.0});
    const std::string module = emit_stablehlo(*graph).module;
    // The pass rewrote a copy: the caller's graph (which may still run on TorchScript) keeps
    // both thresholds where they were.
    int64_t thresholds = 0;
    for (const torch::jit::Node* n : graph->nodes())
      thresholds += n->kind() == c10::Symbol::fromQualString("aten::threshold_backward");
    EXPECT_EQ(thresholds, 2);
    // The threshold on the ReLU's output compares at the pool's size when the windows do not
    // overlap, at the input's otherwise; the one on %x (no pool between) at the input's always.
    auto compares_at = [&](const std::vector<int64_t>& dims) {
      std::string type = "tensor<";
      for (int64_t d : dims) type += std::to_string(d) + "x";
      type += "i1>";
      size_t count = 0;
      for (size_t at = module.find("comparison_direction LE"); at != std::string::npos;
           at = module.find("comparison_direction LE", at + 1)) {
        const size_t end = module.find('\n', at);
        if (module.substr(at, end - at).find("-> " + type) != std::string::npos) ++count;
      }
      return count;
    };
    EXPECT_EQ(compares_at(c.y), c.flag ? 1u : 0u) << module;
    EXPECT_EQ(compares_at(c.x), c.flag ? 1u : 2u) << module;
  }
}
