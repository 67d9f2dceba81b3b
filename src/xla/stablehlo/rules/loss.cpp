// SPDX-License-Identifier: Apache-2.0
// Loss rules: binary cross-entropy and smooth L1, with their backwards, as libtorch's CPU kernels
// write them. 16-bit floats are computed in float32 and each result rounded once; the mean
// reduction sums in float32 too.

#include "xla/stablehlo/lowering.h"

namespace fulgur::xla::stablehlo {
namespace {

// Reduction::None, Mean, Sum as the lowering passes them.
constexpr int64_t kNone = 0, kMean = 1, kSum = 2;

int64_t element_count(const Dims& dims) {
  int64_t k = 1;
  for (int64_t d : dims) k *= d;
  return k;
}

// The per-element `losses` reduced as `reduction` asks, rounded to the output's dtype.
void set_reduced(LoweringContext& cx, const Node* n, const Operand& losses, int64_t reduction) {
  const c10::ScalarType out = cx.out_dtype(n);
  Dims all;
  for (size_t d = 0; d < losses.dims.size(); ++d) all.push_back(static_cast<int64_t>(d));
  if (reduction == kNone) {
    cx.set(n, 0, cx.as(losses, out));
  } else if (reduction == kMean || reduction == kSum) {
    Operand r = cx.reduce(losses, all, "stablehlo.add", 0);
    if (reduction == kMean) r = cx.binary("stablehlo.divide", r, number(element_count(losses.dims)), r.dtype);
    cx.set(n, 0, cx.as(r, out));
  } else {
    throw Unsupported{"reduction " + std::to_string(reduction)};
  }
}

// The gradient of a reduced loss: grad (0-d for mean and sum) broadcast to `dims`, divided by
// the element count for mean.
Operand spread_grad(LoweringContext& cx, const Operand& grad, const Dims& dims, int64_t reduction) {
  if (reduction != kNone && reduction != kMean && reduction != kSum)
    throw Unsupported{"reduction " + std::to_string(reduction)};
  Operand g = cx.broadcast_to(grad, dims);
  if (reduction == kMean) g = cx.binary("stablehlo.divide", g, number(element_count(dims)), g.dtype);
  return g;
}

// (self, target, weight?, reduction): (target - 1) * max(log1p(-x), -100) - target * max(log(x),
// -100), times weight, reduced. libtorch's kernel; its check that x is in [0, 1] is not made.
void binary_cross_entropy(LoweringContext& cx, const Node* n) {
  const c10::ScalarType t = accumulation_type(cx.out_dtype(n));
  const Operand x = cx.as(cx.in(n, 0), t), y = cx.as(cx.in(n, 1), t);
  const Operand floor = cx.splat(-100, {}, t);
  const Operand log_x = cx.binary("stablehlo.maximum", cx.unary("stablehlo.log", x), floor, t);
  const Operand log_1mx =
      cx.binary("stablehlo.maximum", cx.unary("stablehlo.log_plus_one", cx.unary("stablehlo.negate", x)), floor, t);
  Operand losses = cx.sub(cx.mul(cx.sub(y, cx.splat(1, {}, t)), log_1mx), cx.mul(y, log_x));
  if (!cx.none_arg(n, 2)) losses = cx.mul(losses, cx.as(cx.in(n, 2), t));
  set_reduced(cx, n, losses, cx.int_arg(n, 3, "reduction"));
}

// (grad, self, target, weight?, reduction): grad * (x - target) / max((1 - x) * x, 1e-12), times
// weight, divided by the element count for mean.
void binary_cross_entropy_backward(LoweringContext& cx, const Node* n) {
  const c10::ScalarType out = cx.out_dtype(n), t = accumulation_type(out);
  const Operand x = cx.as(cx.in(n, 1), t), y = cx.as(cx.in(n, 2), t);
  const Operand g = spread_grad(cx, cx.as(cx.in(n, 0), t), x.dims, cx.int_arg(n, 4, "reduction"));
  const Operand denominator =
      cx.binary("stablehlo.maximum", cx.mul(cx.sub(cx.splat(1, {}, t), x), x), number(1e-12), t);
  Operand r = cx.binary("stablehlo.divide", cx.mul(g, cx.sub(x, y)), denominator, t);
  if (!cx.none_arg(n, 3)) r = cx.mul(r, cx.as(cx.in(n, 3), t));
  cx.set(n, 0, cx.as(r, out));
}

// (self, target, reduction, beta): z = |x - target|; z < beta ? 0.5 * z^2 / beta : z - 0.5 * beta
// (beta 0: z, the L1 loss).
void smooth_l1_loss(LoweringContext& cx, const Node* n) {
  const c10::ScalarType t = accumulation_type(cx.out_dtype(n));
  const Operand z = cx.unary("stablehlo.abs", cx.binary("stablehlo.subtract", cx.in(n, 0), cx.in(n, 1), t));
  const double beta = cx.known_number(n, 3, "beta").toDouble();
  Operand losses = z;
  if (beta != 0) {
    const Operand quadratic = cx.binary("stablehlo.divide", cx.mul(cx.mul(z, number(0.5)), z), number(beta), t);
    losses = cx.select(cx.compare("LT", z, number(beta), t), quadratic, cx.sub(z, cx.splat(0.5 * beta, {}, t)));
  }
  set_reduced(cx, n, losses, cx.int_arg(n, 2, "reduction"));
}

// (grad, self, target, reduction, beta), x = self - target: -grad where x <= -beta, grad where
// x >= beta, x * grad / beta between (beta 0: sign(x) * grad, the L1 loss's), over the element
// count for mean.
void smooth_l1_loss_backward(LoweringContext& cx, const Node* n) {
  const c10::ScalarType out = cx.out_dtype(n), t = accumulation_type(out);
  const Operand x = cx.binary("stablehlo.subtract", cx.in(n, 1), cx.in(n, 2), t);
  const Dims dims = cx.out_dims(n);
  const Operand g = spread_grad(cx, cx.as(cx.in(n, 0), t), dims, cx.int_arg(n, 3, "reduction"));
  const double beta = cx.known_number(n, 4, "beta").toDouble();
  const Operand xb = cx.broadcast_to(x, dims);
  Operand r;
  if (beta == 0) {
    r = cx.mul(cx.unary("stablehlo.sign", xb), g);
  } else {
    const Operand inner = cx.binary("stablehlo.divide", cx.mul(xb, g), number(beta), t);
    r = cx.select(cx.compare("GE", xb, number(beta), t), g, inner);
    r = cx.select(cx.compare("LE", xb, number(-beta), t), cx.unary("stablehlo.negate", g), r);
  }
  cx.set(n, 0, cx.as(r, out));
}

}  // namespace

void add_loss_rules(RuleTable& table) {
  table.add("aten::binary_cross_entropy", binary_cross_entropy, "XlaOps.BinaryCrossEntropyAndItsBackward");
  table.add("aten::binary_cross_entropy_backward", binary_cross_entropy_backward,
            "XlaOps.BinaryCrossEntropyAndItsBackward");
  table.add("aten::smooth_l1_loss", smooth_l1_loss, "XlaOps.SmoothL1LossAndItsBackward");
  table.add("aten::smooth_l1_loss_backward", smooth_l1_loss_backward, "XlaOps.SmoothL1LossAndItsBackward");
}

}  // namespace fulgur::xla::stablehlo
