// SPDX-License-Identifier: Apache-2.0
// Elementwise rules: arithmetic (add, sub, mul, div, pow, addcmul, addcdiv), bitwise and/or,
// unary math and
// activations (gelu, relu, ...) with their backwards, comparisons, maximum/minimum, clamp,
// masked_fill and where, and the scalar arguments the lazy lowering passes as 0-d tensors. Each follows
// libtorch's CPU kernel: the result has the output's dtype and every operand is converted to it;
// tanh, sigmoid, exp, log, rsqrt, log_sigmoid and the backwards of tanh and sigmoid compute
// 16-bit floats in float32 and round once (libtorch's vectorized kernels convert them);
// comparisons compare in the operands' promoted type; NaN propagates through maximum, minimum and
// clamp as in torch.maximum and torch.clamp.

#include "xla/stablehlo/lowering.h"

#include <cmath>

namespace fulgur::xla::stablehlo {
namespace {

// self <name> other, broadcast, in the output's dtype.
void binary_op(LoweringContext& cx, const Node* n, const std::string& name) {
  cx.set(n, 0, cx.binary(name, cx.in(n, 0), cx.in(n, 1), cx.out_dtype(n)));
}

// add and sub: self <name> alpha * other, alpha skipped when it is the constant 1.
void add_or_sub(LoweringContext& cx, const Node* n, const std::string& name) {
  const c10::ScalarType t = cx.out_dtype(n);
  Operand other = cx.in(n, 1);
  if (n->inputs().size() > 2) other = cx.scaled(cx.as(other, t), cx.in(n, 2));
  cx.set(n, 0, cx.binary(name, cx.in(n, 0), other, t));
}

// addcmul: self + value * t1 * t2; addcdiv: self + value * t1 / t2 (libtorch's order).
void addcop(LoweringContext& cx, const Node* n, const std::string& name) {
  const c10::ScalarType t = cx.out_dtype(n);
  const Operand prod = cx.binary(name, cx.scaled(cx.as(cx.in(n, 1), t), cx.in(n, 3)), cx.in(n, 2), t);
  cx.set(n, 0, cx.binary("stablehlo.add", cx.in(n, 0), prod, t));
}

// The `approximate` argument of gelu and gelu_backward: false for "none", true for "tanh".
bool tanh_approximation(LoweringContext& cx, const Node* n, size_t i) {
  const std::string approximate = cx.constant(n, i, "approximate").toStringRef();
  if (approximate != "none" && approximate != "tanh") throw Unsupported{"approximate '" + approximate + "'"};
  return approximate == "tanh";
}

// libtorch's CPU formulas (GeluKernel.cpp): x * 0.5 * (1 + erf(x / sqrt(2))), or with "tanh"
// 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3))).
void gelu(LoweringContext& cx, const Node* n) {
  const c10::ScalarType t = cx.out_dtype(n);
  const Operand x = cx.as(cx.in(n, 0), t);
  if (tanh_approximation(cx, n, 1)) {
    const Operand cube = cx.mul(cx.mul(x, x), x);
    const Operand inner = cx.mul(cx.add(x, cx.mul(cube, number(0.044715))), number(M_SQRT2 * M_2_SQRTPI * 0.5));
    cx.set(n, 0, cx.mul(cx.mul(x, number(0.5)), cx.add(cx.unary("stablehlo.tanh", inner), number(1))));
    return;
  }
  const Operand erf = cx.op("chlo.erf", {cx.mul(x, number(M_SQRT1_2))}, x.dims, t);
  cx.set(n, 0, cx.mul(cx.mul(x, number(0.5)), cx.add(erf, number(1))));
}

// grad * (cdf(x) + x * pdf(x)), and the derivative of the tanh form, as libtorch's CPU kernel.
void gelu_backward(LoweringContext& cx, const Node* n) {
  const c10::ScalarType t = cx.out_dtype(n);
  const Operand grad = cx.as(cx.in(n, 0), t), x = cx.as(cx.in(n, 1), t);
  if (tanh_approximation(cx, n, 2)) {
    const double beta = M_SQRT2 * M_2_SQRTPI * 0.5, kappa = 0.044715;
    const Operand x_sq = cx.mul(x, x);
    const Operand inner = cx.mul(cx.add(x, cx.mul(cx.mul(x_sq, x), number(kappa))), number(beta));
    const Operand tanh_inner = cx.unary("stablehlo.tanh", inner);
    const Operand left = cx.mul(x, number(0.5));
    const Operand right = cx.add(tanh_inner, number(1));
    const Operand left_derivative = cx.mul(right, number(0.5));
    const Operand tanh_derivative = cx.sub(cx.splat(1, {}, t), cx.mul(tanh_inner, tanh_inner));
    const Operand inner_derivative = cx.mul(cx.add(cx.mul(x_sq, number(3 * kappa)), number(1)), number(beta));
    const Operand right_derivative = cx.mul(left, cx.mul(tanh_derivative, inner_derivative));
    cx.set(n, 0, cx.mul(grad, cx.add(left_derivative, right_derivative)));
    return;
  }
  const Operand erf = cx.op("chlo.erf", {cx.mul(x, number(M_SQRT1_2))}, x.dims, t);
  const Operand cdf = cx.mul(cx.add(erf, number(1)), number(0.5));
  const Operand density = cx.unary("stablehlo.exponential", cx.mul(cx.mul(x, x), number(-0.5)));
  const Operand pdf = cx.mul(density, number(M_2_SQRTPI * M_SQRT1_2 * 0.5));
  cx.set(n, 0, cx.mul(grad, cx.add(cdf, cx.mul(x, pdf))));
}

void add(LoweringContext& cx, const Node* n) { add_or_sub(cx, n, "stablehlo.add"); }
void sub(LoweringContext& cx, const Node* n) { add_or_sub(cx, n, "stablehlo.subtract"); }
void mul(LoweringContext& cx, const Node* n) { binary_op(cx, n, "stablehlo.multiply"); }
void pow(LoweringContext& cx, const Node* n) { binary_op(cx, n, "stablehlo.power"); }
// bitwise and / or of bools or integers (what fulgur's logical_and and logical_or are made of).
void bitwise(LoweringContext& cx, const Node* n, const char* name) {
  if (is_floating(cx.out_dtype(n))) throw Unsupported{"a floating dtype"};
  binary_op(cx, n, name);
}
void bitwise_and(LoweringContext& cx, const Node* n) { bitwise(cx, n, "stablehlo.and"); }
void bitwise_or(LoweringContext& cx, const Node* n) { bitwise(cx, n, "stablehlo.or"); }
void addcmul(LoweringContext& cx, const Node* n) { addcop(cx, n, "stablehlo.multiply"); }
void addcdiv(LoweringContext& cx, const Node* n) { addcop(cx, n, "stablehlo.divide"); }

// True division only: a rounding mode is reported.
void div(LoweringContext& cx, const Node* n) {
  if (n->inputs().size() > 2 && !cx.none_arg(n, 2))
    throw Unsupported{"rounding_mode '" + cx.constant(n, 2, "rounding_mode").toStringRef() + "'"};
  binary_op(cx, n, "stablehlo.divide");
}

void sqrt(LoweringContext& cx, const Node* n) {
  cx.set(n, 0, cx.unary("stablehlo.sqrt", cx.as(cx.in(n, 0), cx.out_dtype(n))));
}

void relu(LoweringContext& cx, const Node* n) {
  cx.set(n, 0, cx.binary("stablehlo.maximum", cx.in(n, 0), number(0), cx.out_dtype(n)));
}

// libtorch 2.x's lazy lowering passes a scalar argument (alpha, beta, a threshold) as a 0-d
// tensor parameter converted by ScalarImplicit: a number of that tensor's dtype.
void scalar_implicit(LoweringContext& cx, const Node* n) {
  const Operand x = cx.materialized(cx.in(n, 0));
  if (!x.dims.empty()) throw Unsupported{"a tensor of " + std::to_string(x.dims.size()) + " dims"};
  cx.set_value(n->output(0), Operand{x.ssa, {}, x.dtype, Tier::number, x.constant});
}

// zero and zeros_like: zeros of the output's type.
void zeros(LoweringContext& cx, const Node* n) { cx.set(n, 0, cx.splat(0, cx.out_dims(n), cx.out_dtype(n))); }

// A unary op of input 0 computed in the output's accumulation type.
void unary_in_float(LoweringContext& cx, const Node* n, const char* name) {
  const c10::ScalarType out = cx.out_dtype(n), t = accumulation_type(out);
  cx.set(n, 0, cx.as(cx.unary(name, cx.as(cx.in(n, 0), t)), out));
}

void tanh(LoweringContext& cx, const Node* n) { unary_in_float(cx, n, "stablehlo.tanh"); }
void sigmoid(LoweringContext& cx, const Node* n) { unary_in_float(cx, n, "stablehlo.logistic"); }
void exp(LoweringContext& cx, const Node* n) { unary_in_float(cx, n, "stablehlo.exponential"); }
void log(LoweringContext& cx, const Node* n) { unary_in_float(cx, n, "stablehlo.log"); }
void rsqrt(LoweringContext& cx, const Node* n) { unary_in_float(cx, n, "stablehlo.rsqrt"); }

// neg, abs and sgn are exact in any dtype.
void neg(LoweringContext& cx, const Node* n) {
  cx.set(n, 0, cx.unary("stablehlo.negate", cx.as(cx.in(n, 0), cx.out_dtype(n))));
}
void abs(LoweringContext& cx, const Node* n) {
  cx.set(n, 0, cx.unary("stablehlo.abs", cx.as(cx.in(n, 0), cx.out_dtype(n))));
}
// sgn of a real number as libtorch computes it, (0 < x) - (x < 0): -1, 1, or +0 for zeros of
// either sign and for NaN (where stablehlo.sign would keep -0 and NaN).
void sgn(LoweringContext& cx, const Node* n) {
  const c10::ScalarType t = cx.out_dtype(n);
  const Operand x = cx.as(cx.in(n, 0), t);
  if (t == c10::kBool) {
    cx.set(n, 0, x);
    return;
  }
  const Operand one = cx.splat(1, {}, t), zero = cx.splat(0, {}, t);
  const Operand above = cx.select(cx.compare("GT", x, zero, t), one, zero);
  const Operand below = cx.select(cx.compare("LT", x, zero, t), one, zero);
  cx.set(n, 0, cx.sub(above, below));
}

// (grad, output) -> grad * (1 - output^2), libtorch's tanh_backward.
void tanh_backward(LoweringContext& cx, const Node* n) {
  const c10::ScalarType out = cx.out_dtype(n), t = accumulation_type(out);
  const Operand grad = cx.as(cx.in(n, 0), t), y = cx.as(cx.in(n, 1), t);
  cx.set(n, 0, cx.as(cx.mul(grad, cx.sub(cx.splat(1, {}, t), cx.mul(y, y))), out));
}

// (grad, output) -> grad * (1 - output) * output, libtorch's sigmoid_backward.
void sigmoid_backward(LoweringContext& cx, const Node* n) {
  const c10::ScalarType out = cx.out_dtype(n), t = accumulation_type(out);
  const Operand grad = cx.as(cx.in(n, 0), t), y = cx.as(cx.in(n, 1), t);
  cx.set(n, 0, cx.as(cx.mul(cx.mul(grad, cx.sub(cx.splat(1, {}, t), y)), y), out));
}

// self <op> other, tensors or numbers, in their promoted type (torch.result_type).
void comparison(LoweringContext& cx, const Node* n, const char* direction) {
  const Operand &a = cx.in(n, 0), &b = cx.in(n, 1);
  cx.set(n, 0, cx.compare(direction, a, b, result_type({&a, &b})));
}
void eq(LoweringContext& cx, const Node* n) { comparison(cx, n, "EQ"); }
void ne(LoweringContext& cx, const Node* n) { comparison(cx, n, "NE"); }
void lt(LoweringContext& cx, const Node* n) { comparison(cx, n, "LT"); }
void le(LoweringContext& cx, const Node* n) { comparison(cx, n, "LE"); }
void gt(LoweringContext& cx, const Node* n) { comparison(cx, n, "GT"); }
void ge(LoweringContext& cx, const Node* n) { comparison(cx, n, "GE"); }

// stablehlo.maximum or minimum (`name`) of `a` and `b` in `t`, NaN when either is NaN, as
// torch.maximum, torch.minimum and torch.clamp give: XLA:CPU's maximum returns the first operand
// when only the second is NaN, so NaN is chosen explicitly.
Operand nan_propagating(LoweringContext& cx, const char* name, const Operand& a, const Operand& b,
                        c10::ScalarType t) {
  const Operand r = cx.binary(name, a, b, t);
  if (!is_floating(t)) return r;
  const Operand x = cx.broadcast_to(cx.as(a, t), r.dims), y = cx.broadcast_to(cx.as(b, t), r.dims);
  return cx.select(cx.compare("NE", x, x, t), x, cx.select(cx.compare("NE", y, y, t), y, r));
}

void maximum(LoweringContext& cx, const Node* n) {
  cx.set(n, 0, nan_propagating(cx, "stablehlo.maximum", cx.in(n, 0), cx.in(n, 1), cx.out_dtype(n)));
}
void minimum(LoweringContext& cx, const Node* n) {
  cx.set(n, 0, nan_propagating(cx, "stablehlo.minimum", cx.in(n, 0), cx.in(n, 1), cx.out_dtype(n)));
}

// (self, min?, max?) -> min(max(self, min), max), either bound None; tensors or numbers. With
// min > max every element is max, as in libtorch.
void clamp(LoweringContext& cx, const Node* n) {
  const c10::ScalarType t = cx.out_dtype(n);
  Operand x = cx.as(cx.in(n, 0), t);
  if (!cx.none_arg(n, 1)) x = nan_propagating(cx, "stablehlo.maximum", x, cx.in(n, 1), t);
  if (!cx.none_arg(n, 2)) x = nan_propagating(cx, "stablehlo.minimum", x, cx.in(n, 2), t);
  cx.set(n, 0, cx.broadcast_to(x, cx.out_dims(n)));
}
void clamp_min(LoweringContext& cx, const Node* n) {
  cx.set(n, 0, nan_propagating(cx, "stablehlo.maximum", cx.in(n, 0), cx.in(n, 1), cx.out_dtype(n)));
}

// (self, mask, value) -> value where mask, self elsewhere; value a number or a 0-d tensor,
// converted to self's dtype; mask broadcast to self.
void masked_fill(LoweringContext& cx, const Node* n) {
  const c10::ScalarType t = cx.out_dtype(n);
  const Dims dims = cx.out_dims(n);
  const Operand& value = cx.in(n, 2);
  if (!value.dims.empty()) throw Unsupported{"a value of " + std::to_string(value.dims.size()) + " dims"};
  const Operand mask = cx.broadcast_to(cx.as(cx.in(n, 1), c10::kBool), dims);
  cx.set(n, 0, cx.select(mask, cx.broadcast_to(cx.as(value, t), dims), cx.broadcast_to(cx.as(cx.in(n, 0), t), dims)));
}

// where(condition, self, other): self where condition, other elsewhere, broadcast, in the
// output's dtype (self and other promoted, as torch.where). The node is fulgur's Lazy kernel's
// (src/xla/lazy_views.cpp): the lazy core has none.
void where(LoweringContext& cx, const Node* n) {
  const c10::ScalarType t = cx.out_dtype(n);
  const Dims dims = cx.out_dims(n);
  const Operand condition = cx.broadcast_to(cx.as(cx.in(n, 0), c10::kBool), dims);
  cx.set(n, 0, cx.select(condition, cx.broadcast_to(cx.as(cx.in(n, 1), t), dims),
                         cx.broadcast_to(cx.as(cx.in(n, 2), t), dims)));
}

// (self) -> (output, buffer): output = min(x, 0) - log1p(exp(-|x|)) and buffer = exp(-|x|),
// libtorch's CPU kernel (whose backward reads the buffer).
void log_sigmoid_forward(LoweringContext& cx, const Node* n) {
  const c10::ScalarType out = cx.out_dtype(n, 0), t = accumulation_type(out);
  const Operand x = cx.as(cx.in(n, 0), t);
  const Operand z = cx.unary("stablehlo.exponential", cx.unary("stablehlo.negate", cx.unary("stablehlo.abs", x)));
  const Operand low = cx.binary("stablehlo.minimum", x, cx.splat(0, {}, t), t);
  cx.set(n, 0, cx.as(cx.sub(low, cx.unary("stablehlo.log_plus_one", z)), out));
  cx.set(n, 1, cx.reshape(cx.as(z, cx.out_dtype(n, 1)), cx.out_dims(n, 1)));
}

// (grad, self, buffer) -> grad * (x < 0 ? 1 - z / (1 + z) : z / (1 + z)) with z the buffer,
// libtorch's CPU kernel.
void log_sigmoid_backward(LoweringContext& cx, const Node* n) {
  const c10::ScalarType out = cx.out_dtype(n), t = accumulation_type(out);
  const Operand grad = cx.as(cx.in(n, 0), t), x = cx.as(cx.in(n, 1), t), z = cx.as(cx.in(n, 2), t);
  const Operand part = cx.binary("stablehlo.divide", z, cx.add(z, cx.splat(1, {}, t)), t);
  const Operand negative = cx.compare("LT", x, number(0), t);
  const Operand d = cx.select(negative, cx.sub(cx.splat(1, {}, t), part), part);
  cx.set(n, 0, cx.as(cx.mul(grad, d), out));
}

}  // namespace

void add_elementwise_rules(RuleTable& table) {
  table.add("aten::add", add, "StableHlo.ArithmeticBroadcastsAndConvertsScalarsAsLibtorch");
  table.add("aten::sub", sub, "StableHlo.ArithmeticBroadcastsAndConvertsScalarsAsLibtorch");
  table.add("aten::mul", mul, "StableHlo.ArithmeticBroadcastsAndConvertsScalarsAsLibtorch");
  table.add("aten::div", div, "StableHlo.ArithmeticBroadcastsAndConvertsScalarsAsLibtorch");
  table.add("aten::pow", pow, "StableHlo.PowOfNegativeBasesAndTensorExponents");
  table.add("aten::bitwise_and", bitwise_and, "XlaOps.BitwiseAndLogicalAndOr");
  table.add("aten::bitwise_or", bitwise_or, "XlaOps.BitwiseAndLogicalAndOr");
  table.add("aten::sqrt", sqrt, "StableHlo.ArithmeticBroadcastsAndConvertsScalarsAsLibtorch");
  table.add("aten::relu", relu, "StableHlo.ReductionsComparisonsReluAndThresholdBackward");
  table.add("aten::addcmul", addcmul, "StableHlo.ArithmeticBroadcastsAndConvertsScalarsAsLibtorch");
  table.add("aten::addcdiv", addcdiv, "StableHlo.ArithmeticBroadcastsAndConvertsScalarsAsLibtorch");
  table.add("aten::ScalarImplicit", scalar_implicit, "XlaOps.NormOfEveryOrderAndItsBackward");
  table.add("aten::zero", zeros, "StableHlo.ZeroCopiesViewsAndTransposes");
  table.add("aten::zeros_like", zeros, "StableHlo.ZeroCopiesViewsAndTransposes");
  table.add("aten::gelu", gelu, "StableHlo.GeluAndItsBackwardBothApproximations");
  table.add("aten::gelu_backward", gelu_backward, "StableHlo.GeluAndItsBackwardBothApproximations");
  table.add("aten::tanh", tanh, "XlaOps.UnaryMathAndItsBackwards");
  table.add("aten::sigmoid", sigmoid, "XlaOps.UnaryMathAndItsBackwards");
  table.add("aten::exp", exp, "XlaOps.UnaryMathAndItsBackwards");
  table.add("aten::log", log, "XlaOps.UnaryMathAndItsBackwards");
  table.add("aten::rsqrt", rsqrt, "XlaOps.UnaryMathAndItsBackwards");
  table.add("aten::neg", neg, "XlaOps.UnaryMathAndItsBackwards");
  table.add("aten::abs", abs, "XlaOps.UnaryMathAndItsBackwards");
  table.add("aten::sgn", sgn, "XlaOps.UnaryMathAndItsBackwards");
  table.add("aten::tanh_backward", tanh_backward, "XlaOps.UnaryMathAndItsBackwards");
  table.add("aten::sigmoid_backward", sigmoid_backward, "XlaOps.UnaryMathAndItsBackwards");
  table.add("aten::eq", eq, "XlaOps.ComparisonsBroadcastPromoteAndTreatNanAsIeee");
  table.add("aten::ne", ne, "XlaOps.ComparisonsBroadcastPromoteAndTreatNanAsIeee");
  table.add("aten::lt", lt, "XlaOps.ComparisonsBroadcastPromoteAndTreatNanAsIeee");
  table.add("aten::le", le, "XlaOps.ComparisonsBroadcastPromoteAndTreatNanAsIeee");
  table.add("aten::gt", gt, "XlaOps.ComparisonsBroadcastPromoteAndTreatNanAsIeee");
  table.add("aten::ge", ge, "XlaOps.ComparisonsBroadcastPromoteAndTreatNanAsIeee");
  table.add("aten::maximum", maximum, "XlaOps.MaximumMinimumAndClampPropagateNan");
  table.add("aten::minimum", minimum, "XlaOps.MaximumMinimumAndClampPropagateNan");
  table.add("aten::clamp", clamp, "XlaOps.MaximumMinimumAndClampPropagateNan");
  table.add("aten::clamp_min", clamp_min, "XlaOps.MaximumMinimumAndClampPropagateNan");
  table.add("aten::masked_fill", masked_fill, "XlaOps.MaskedFillAndItsBackward");
  table.add("aten::where", where, "XlaOps.WhereBroadcastsPromotesAndItsBackward");
  table.add("aten::log_sigmoid_forward", log_sigmoid_forward, "XlaOps.BinaryCrossEntropyAndItsBackward");
  table.add("aten::log_sigmoid_backward", log_sigmoid_backward, "XlaOps.BinaryCrossEntropyAndItsBackward");
}

}  // namespace fulgur::xla::stablehlo
