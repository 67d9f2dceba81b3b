// SPDX-License-Identifier: Apache-2.0
// Softmax and loss rules: (log_)softmax and their backwards, NLL loss and its backward. 16-bit
// floats are computed in float32 and each result rounded once, as libtorch's kernels do.

#include "xla/stablehlo/lowering.h"

#include <limits>

namespace fulgur::xla::stablehlo {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The [N, C] one-hot mask of `target1d` (ignored rows all false) and each row's weight (input
// `weight_input` of `n`, or 1).
std::pair<Operand, Operand> nll_mask_and_weights(LoweringContext& cx, const Node* n, const Operand& self2d,
                                                 const Operand& target1d, size_t weight_input, int64_t ignore_index) {
  const c10::ScalarType t = self2d.dtype;
  const Dims& nc = self2d.dims;
  const Operand classes = cx.op("stablehlo.iota", {}, nc, c10::kLong, "iota_dimension = 1 : i64");
  const Operand target = cx.as(target1d, c10::kLong);
  const Operand kept =
      cx.compare("NE", target, Operand{"", {}, c10::kLong, Tier::number, c10::Scalar(ignore_index)}, c10::kLong);
  const Operand hit = cx.compare(
      "EQ", classes, cx.op("stablehlo.broadcast_in_dim", {target}, nc, c10::kLong, "broadcast_dimensions = array<i64: 0>"),
      c10::kLong);
  const Operand mask = cx.op(
      "stablehlo.and",
      {hit, cx.op("stablehlo.broadcast_in_dim", {kept}, nc, c10::kBool, "broadcast_dimensions = array<i64: 0>")}, nc,
      c10::kBool);
  Operand weights;  // [N]
  if (cx.none_arg(n, weight_input)) {
    weights = cx.select(kept, cx.splat(1, kept.dims, t), cx.splat(0, kept.dims, t));
  } else {
    const Operand w = cx.broadcast_to(cx.as(cx.in(n, weight_input), t), nc);
    weights = cx.reduce(cx.select(mask, w, cx.splat(0, nc, t)), {1}, "stablehlo.add", 0);
  }
  return {mask, weights};
}

// The softmax family computes in accumulation_type() and rounds its result once, as libtorch's
// CPU kernels convert 16-bit floats to float32 for the whole row (the row sums above all).
void log_softmax(LoweringContext& cx, const Node* n) {
  const c10::ScalarType out = cx.out_dtype(n), t = accumulation_type(out);
  const Operand x = cx.as(cx.in(n, 0), t);
  const Dims dims = {wrap_dim(cx.int_arg(n, 1, "dim"), x.dims.size())};
  if (x.dims.empty()) {
    cx.set(n, 0, cx.splat(0, {}, out));
    return;
  }
  const Operand max = cx.keep_dims(cx.reduce(x, dims, "stablehlo.maximum", -kInf), x.dims, dims);
  const Operand shifted = cx.binary("stablehlo.subtract", x, max, t);
  const Operand exp = cx.op("stablehlo.exponential", {shifted}, x.dims, t);
  const Operand sum = cx.reduce(exp, dims, "stablehlo.add", 0);
  const Operand lse = cx.keep_dims(cx.op("stablehlo.log", {sum}, sum.dims, t), x.dims, dims);
  cx.set(n, 0, cx.as(cx.binary("stablehlo.subtract", shifted, lse, t), out));
}

// grad - exp(output) * sum(grad, dim)
void log_softmax_backward(LoweringContext& cx, const Node* n) {
  const c10::ScalarType out = cx.out_dtype(n), t = accumulation_type(out);
  const Operand grad = cx.as(cx.in(n, 0), t), output = cx.as(cx.in(n, 1), t);
  const Dims dims = {wrap_dim(cx.int_arg(n, 2, "dim"), grad.dims.size())};
  if (grad.dims.empty()) {
    cx.set(n, 0, cx.as(grad, out));
    return;
  }
  const Operand sum = cx.keep_dims(cx.reduce(grad, dims, "stablehlo.add", 0), grad.dims, dims);
  const Operand exp = cx.op("stablehlo.exponential", {output}, output.dims, t);
  cx.set(n, 0, cx.as(cx.binary("stablehlo.subtract", grad, cx.binary("stablehlo.multiply", exp, sum, t), t), out));
}

void softmax(LoweringContext& cx, const Node* n) {
  const c10::ScalarType out = cx.out_dtype(n), t = accumulation_type(out);
  const Operand x = cx.as(cx.in(n, 0), t);
  const Dims dims = {wrap_dim(cx.int_arg(n, 1, "dim"), x.dims.size())};
  if (x.dims.empty()) {
    cx.set(n, 0, cx.splat(1, {}, out));
    return;
  }
  const Operand max = cx.keep_dims(cx.reduce(x, dims, "stablehlo.maximum", -kInf), x.dims, dims);
  const Operand exp = cx.op("stablehlo.exponential", {cx.binary("stablehlo.subtract", x, max, t)}, x.dims, t);
  const Operand sum = cx.keep_dims(cx.reduce(exp, dims, "stablehlo.add", 0), x.dims, dims);
  cx.set(n, 0, cx.as(cx.binary("stablehlo.divide", exp, sum, t), out));
}

// output * (grad - sum(grad * output, dim))
void softmax_backward(LoweringContext& cx, const Node* n) {
  const c10::ScalarType out = cx.out_dtype(n), t = accumulation_type(out);
  const Operand grad = cx.as(cx.in(n, 0), t), output = cx.as(cx.in(n, 1), t);
  const Dims dims = {wrap_dim(cx.int_arg(n, 2, "dim"), grad.dims.size())};
  if (grad.dims.empty()) {
    cx.set(n, 0, cx.splat(0, {}, out));
    return;
  }
  const Operand prod = cx.binary("stablehlo.multiply", grad, output, t);
  const Operand sum = cx.keep_dims(cx.reduce(prod, dims, "stablehlo.add", 0), grad.dims, dims);
  cx.set(n, 0, cx.as(cx.binary("stablehlo.multiply", output, cx.binary("stablehlo.subtract", grad, sum, t), t), out));
}

// (self [N, C] or [C], target [N] or [], weight, reduction, ignore_index) -> (output, total_weight)
// The losses, their sum and the total weight in float32 for 16-bit floats, each result rounded
// once, as libtorch sums them in float32 (4096 ones summed in bfloat16 stop at 256).
void nll_loss_forward(LoweringContext& cx, const Node* n) {
  const c10::ScalarType out = cx.out_dtype(n, 0), t = accumulation_type(out);
  const Operand& self_in = cx.in(n, 0);
  if (self_in.dims.size() != 1 && self_in.dims.size() != 2)
    throw Unsupported{"input of " + std::to_string(self_in.dims.size()) + " dimensions"};
  const int64_t reduction = cx.int_arg(n, 3, "reduction"), ignore_index = cx.int_arg(n, 4, "ignore_index");
  const int64_t rows = self_in.dims.size() == 2 ? self_in.dims[0] : 1, c = self_in.dims.back();
  const Operand self = cx.reshape(cx.as(self_in, t), {rows, c});
  const Operand target = cx.reshape(cx.in(n, 1), {rows});
  const auto [mask, weights] = nll_mask_and_weights(cx, n, self, target, 2, ignore_index);
  const Operand picked = cx.reduce(cx.select(mask, self, cx.splat(0, {rows, c}, t)), {1}, "stablehlo.add", 0);
  const Operand losses = cx.op("stablehlo.negate", {cx.binary("stablehlo.multiply", picked, weights, t)}, {rows}, t);
  const Operand total_weight = cx.reduce(weights, {0}, "stablehlo.add", 0);
  if (reduction == 0) {  // none
    cx.set(n, 0, cx.reshape(cx.as(losses, out), cx.out_dims(n, 0)));
    cx.set(n, 1, cx.splat(0, {}, cx.out_dtype(n, 1)));
  } else if (reduction == 1 || reduction == 2) {  // mean, sum
    Operand loss = cx.reduce(losses, {0}, "stablehlo.add", 0);
    if (reduction == 1) loss = cx.binary("stablehlo.divide", loss, total_weight, t);
    cx.set(n, 0, cx.as(loss, out));
    cx.set(n, 1, cx.as(total_weight, cx.out_dtype(n, 1)));
  } else {
    throw Unsupported{"reduction " + std::to_string(reduction)};
  }
}

// (grad_output, self, target, weight, reduction, ignore_index, total_weight) -> grad_input:
// -weight[target] * grad (divided by total_weight for mean) at each row's target, 0 elsewhere.
void nll_loss_backward(LoweringContext& cx, const Node* n) {
  const c10::ScalarType t = cx.out_dtype(n);
  const Dims dims = cx.out_dims(n);
  if (dims.size() != 1 && dims.size() != 2)
    throw Unsupported{"input of " + std::to_string(dims.size()) + " dimensions"};
  const int64_t reduction = cx.int_arg(n, 4, "reduction"), ignore_index = cx.int_arg(n, 5, "ignore_index");
  const int64_t rows = dims.size() == 2 ? dims[0] : 1, c = dims.back();
  const Dims nc = {rows, c};
  const Operand target = cx.reshape(cx.in(n, 2), {rows});
  const Operand shape{"", nc, t, Tier::dimensioned, std::nullopt};  // only its dims and dtype are read
  const auto [mask, weights] = nll_mask_and_weights(cx, n, shape, target, 3, ignore_index);
  Operand grad = cx.as(cx.in(n, 0), t);
  if (reduction == 0) {
    grad = cx.reshape(grad, {rows});
  } else if (reduction == 1) {
    grad = cx.binary("stablehlo.divide", grad, cx.in(n, 6), t);
  } else if (reduction != 2) {
    throw Unsupported{"reduction " + std::to_string(reduction)};
  }
  const Operand row = cx.op("stablehlo.negate", {cx.binary("stablehlo.multiply", weights, grad, t)}, {rows}, t);
  const Operand spread = cx.op("stablehlo.broadcast_in_dim", {row}, nc, t, "broadcast_dimensions = array<i64: 0>");
  cx.set(n, 0, cx.reshape(cx.select(mask, spread, cx.splat(0, nc, t)), dims));
}

}  // namespace

void add_softmax_loss_rules(RuleTable& table) {
  table.add("aten::_log_softmax", log_softmax, "StableHlo.LogSoftmaxNllLossAndTheirBackwardsWithIgnoredTargets");
  table.add("aten::_log_softmax_backward_data", log_softmax_backward,
            "StableHlo.LogSoftmaxNllLossAndTheirBackwardsWithIgnoredTargets");
  table.add("aten::_softmax", softmax, "StableHlo.SoftmaxAndItsBackward");
  table.add("aten::_softmax_backward_data", softmax_backward, "StableHlo.SoftmaxAndItsBackward");
  table.add("aten::nll_loss_forward", nll_loss_forward,
            "StableHlo.LogSoftmaxNllLossAndTheirBackwardsWithIgnoredTargets");
  table.add("aten::nll_loss_backward", nll_loss_backward,
            "StableHlo.LogSoftmaxNllLossAndTheirBackwardsWithIgnoredTargets");
}

}  // namespace fulgur::xla::stablehlo
