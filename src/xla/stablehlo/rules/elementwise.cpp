// Elementwise rules: unary math, their backwards, comparisons, maximum/minimum, clamp and
// masked_fill. Each follows libtorch's CPU kernel: the result has the output's dtype; 16-bit
// floats are computed in float32 and rounded once (libtorch's vectorized kernels convert them);
// comparisons compare in the operands' promoted type; NaN propagates through maximum, minimum and
// clamp as in torch.maximum and torch.clamp.

#include "xla/stablehlo/lowering.h"

namespace fulgur::xla::stablehlo {
namespace {

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
  table.add("aten::tanh", tanh);
  table.add("aten::sigmoid", sigmoid);
  table.add("aten::exp", exp);
  table.add("aten::log", log);
  table.add("aten::rsqrt", rsqrt);
  table.add("aten::neg", neg);
  table.add("aten::abs", abs);
  table.add("aten::sgn", sgn);
  table.add("aten::tanh_backward", tanh_backward);
  table.add("aten::sigmoid_backward", sigmoid_backward);
  table.add("aten::eq", eq);
  table.add("aten::ne", ne);
  table.add("aten::lt", lt);
  table.add("aten::le", le);
  table.add("aten::gt", gt);
  table.add("aten::ge", ge);
  table.add("aten::maximum", maximum);
  table.add("aten::minimum", minimum);
  table.add("aten::clamp", clamp);
  table.add("aten::clamp_min", clamp_min);
  table.add("aten::masked_fill", masked_fill);
  table.add("aten::log_sigmoid_forward", log_sigmoid_forward);
  table.add("aten::log_sigmoid_backward", log_sigmoid_backward);
}

}  // namespace fulgur::xla::stablehlo
