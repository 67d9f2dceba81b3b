// SPDX-License-Identifier: Apache-2.0
// Normalization rules: native_layer_norm and native_batch_norm with their backwards. 16-bit
// floats are computed in float32 (statistics, normalization, the backwards' sums) and each result
// rounded once, as libtorch's kernels do.

#include "xla/stablehlo/lowering.h"

#include <algorithm>

namespace fulgur::xla::stablehlo {
namespace {

// A [C] operand broadcast along dim 1 of `full` (the channels of a batch norm's input).
Operand along_channels(LoweringContext& cx, const Operand& c, const Dims& full) {
  return cx.op("stablehlo.broadcast_in_dim", {c}, full, c.dtype, "broadcast_dimensions = array<i64: 1>");
}

// (input, normalized_shape, weight?, bias?, eps) -> (output, mean, rstd), the statistics over
// the last len(normalized_shape) dims, kept as dims of size 1.
// Batch norm's statistics run over every dim but the channels (dim 1): those dims, and the
// elements of one channel.
Dims all_but_channels(const Dims& dims) {
  Dims others;
  for (size_t d = 0; d < dims.size(); ++d)
    if (d != 1) others.push_back(static_cast<int64_t>(d));
  return others;
}

int64_t elements_per_channel(const Dims& dims) {
  int64_t count = 1;
  for (size_t d = 0; d < dims.size(); ++d)
    if (d != 1) count *= dims[d];
  return count;
}

void native_layer_norm(LoweringContext& cx, const Node* n) {
  // The statistics and the normalization in float32 for 16-bit floats (libtorch's kernel
  // accumulates them so), the output rounded once.
  const c10::ScalarType out_t = cx.out_dtype(n, 0);
  const c10::ScalarType t = accumulation_type(out_t);
  const Operand x = cx.as(cx.in(n, 0), t);
  const size_t k = cx.ints_arg(n, 1, "normalized_shape").size();
  if (k > x.dims.size()) throw std::invalid_argument("normalized_shape longer than the input's dims");
  Dims dims;
  int64_t count = 1;
  for (size_t d = x.dims.size() - k; d < x.dims.size(); ++d) {
    dims.push_back(static_cast<int64_t>(d));
    count *= x.dims[d];
  }
  const Operand mean = cx.binary("stablehlo.divide", cx.reduce(x, dims, "stablehlo.add", 0), number(count), t);
  const Operand centered = cx.binary("stablehlo.subtract", x, cx.keep_dims(mean, x.dims, dims), t);
  const Operand squares = cx.reduce(cx.mul(centered, centered), dims, "stablehlo.add", 0);
  const Operand var = cx.binary("stablehlo.divide", squares, number(count), t);
  const Operand rstd = cx.unary("stablehlo.rsqrt", cx.add(var, cx.as(cx.in(n, 4), t)));
  Operand out = cx.mul(centered, cx.keep_dims(rstd, x.dims, dims));
  if (!cx.none_arg(n, 2)) out = cx.mul(out, cx.as(cx.in(n, 2), t));
  if (!cx.none_arg(n, 3)) out = cx.add(out, cx.as(cx.in(n, 3), t));
  cx.set(n, 0, cx.as(out, out_t));
  cx.set(n, 1, cx.reshape(cx.as(mean, cx.out_dtype(n, 1)), cx.out_dims(n, 1)));
  cx.set(n, 2, cx.reshape(cx.as(rstd, cx.out_dtype(n, 2)), cx.out_dims(n, 2)));
}

// (grad_out, input, normalized_shape, mean, rstd, weight?, bias?, output_mask) ->
// (grad_input, grad_weight, grad_bias), libtorch's closed form with x_hat = (x - mean) * rstd and
// g = grad_out * weight: grad_input = rstd * (g - mean(g) - x_hat * mean(g * x_hat)) over the
// normalized dims; grad_weight = sum(grad_out * x_hat), grad_bias = sum(grad_out) over the others.
// An output the mask (or a missing weight or bias) leaves undefined must be unused.
void native_layer_norm_backward(LoweringContext& cx, const Node* n) {
  // In float32 for 16-bit floats, as native_layer_norm.
  const c10::ScalarType t = accumulation_type(cx.out_dtype(n, 0));
  const Operand grad = cx.as(cx.in(n, 0), t), x = cx.as(cx.in(n, 1), t);
  const size_t k = cx.ints_arg(n, 2, "normalized_shape").size();
  const std::vector<bool> mask = cx.constant(n, 7, "output_mask").toBoolList().vec();
  if (k > x.dims.size() || mask.size() != 3) throw std::invalid_argument("bad native_layer_norm_backward arguments");
  Dims inner, outer;
  int64_t count = 1;
  for (size_t d = 0; d < x.dims.size(); ++d) {
    if (d + k >= x.dims.size()) {
      inner.push_back(static_cast<int64_t>(d));
      count *= x.dims[d];
    } else {
      outer.push_back(static_cast<int64_t>(d));
    }
  }
  const Operand rstd = cx.as(cx.in(n, 4), t);
  const Operand x_hat = cx.mul(cx.binary("stablehlo.subtract", x, cx.as(cx.in(n, 3), t), t), rstd);
  const bool has_weight = !cx.none_arg(n, 5), has_bias = !cx.none_arg(n, 6);
  for (size_t i = 0; i < 3; ++i) {
    const bool defined = mask[i] && (i != 1 || has_weight) && (i != 2 || has_bias);
    if (!defined && cx.used(n->output(i))) throw Unsupported{"a use of undefined output " + std::to_string(i)};
  }
  if (mask[0]) {
    const Operand g = has_weight ? cx.mul(grad, cx.as(cx.in(n, 5), t)) : grad;
    auto inner_mean = [&](const Operand& v) {
      const Operand sum = cx.reduce(v, inner, "stablehlo.add", 0);
      return cx.keep_dims(cx.binary("stablehlo.divide", sum, number(count), t), x.dims, inner);
    };
    const Operand centered = cx.binary("stablehlo.subtract", g, inner_mean(g), t);
    const Operand correction = cx.mul(x_hat, inner_mean(cx.mul(g, x_hat)));
    cx.set(n, 0, cx.as(cx.mul(rstd, cx.binary("stablehlo.subtract", centered, correction, t)), cx.out_dtype(n, 0)));
  }
  if (mask[1] && has_weight)
    cx.set(n, 1, cx.as(cx.reduce(cx.mul(grad, x_hat), outer, "stablehlo.add", 0), cx.out_dtype(n, 1)));
  if (mask[2] && has_bias) cx.set(n, 2, cx.as(cx.reduce(grad, outer, "stablehlo.add", 0), cx.out_dtype(n, 2)));
}

// (input [N, C, *], weight?, bias?, running_mean?, running_var?, training, momentum, eps) ->
// (output, save_mean, save_invstd), libtorch's CPU kernel: in training the statistics of each
// channel over N and the spatial dims (biased variance), and the running statistics updated in
// place, running = (1 - momentum) * running + momentum * batch, with the unbiased variance; in
// evaluation the running statistics normalize and save_mean, save_invstd are empty. An updated
// running statistic takes the place of its value for the rest of the graph (the TorchScript
// graph writes into the tensor), and a graph input so updated is returned as an extra result.
// 16-bit floats are computed in float32 (statistics, normalization, running updates) and each
// result rounded once, as libtorch's kernel does.
void native_batch_norm(LoweringContext& cx, const Node* n) {
  const c10::ScalarType out_t = cx.out_dtype(n, 0), t = accumulation_type(out_t);
  const Operand x = cx.as(cx.in(n, 0), t);
  if (x.dims.size() < 2) throw Unsupported{"input of " + std::to_string(x.dims.size()) + " dimensions"};
  const bool training = cx.bool_arg(n, 5, "training");
  const bool has_running = !cx.none_arg(n, 3) && !cx.none_arg(n, 4);
  if (!training && !has_running) throw Unsupported{"evaluation without running statistics"};
  const Dims others = all_but_channels(x.dims);
  const int64_t count = elements_per_channel(x.dims);
  // The statistics that normalize: libtorch's kernel saves them in save_mean's dtype and
  // normalizes with the saved values.
  Operand norm_mean, norm_invstd;
  if (training) {
    const Operand mean = cx.binary("stablehlo.divide", cx.reduce(x, others, "stablehlo.add", 0), number(count), t);
    const Operand centered = cx.binary("stablehlo.subtract", x, along_channels(cx, mean, x.dims), t);
    const Operand squares = cx.reduce(cx.mul(centered, centered), others, "stablehlo.add", 0);
    const Operand var = cx.binary("stablehlo.divide", squares, number(count), t);
    const Operand invstd = cx.unary("stablehlo.rsqrt", cx.add(var, cx.as(cx.in(n, 7), t)));
    norm_mean = cx.rounded_as(mean, cx.out_dtype(n, 1));
    norm_invstd = cx.rounded_as(invstd, cx.out_dtype(n, 2));
    cx.set(n, 1, cx.reshape(cx.as(mean, cx.out_dtype(n, 1)), cx.out_dims(n, 1)));
    cx.set(n, 2, cx.reshape(cx.as(invstd, cx.out_dtype(n, 2)), cx.out_dims(n, 2)));
    if (has_running) {
      const Operand& momentum = cx.in(n, 6);
      const double bessel = count > 1 ? static_cast<double>(count) / static_cast<double>(count - 1) : 1.0;
      const Operand unbiased = count > 1 ? cx.binary("stablehlo.multiply", var, number(bessel), t) : var;
      const Operand keep = cx.binary("stablehlo.subtract", number(1.0), momentum, c10::kDouble);
      for (const auto& [i, batch] : {std::pair<size_t, Operand>{3, mean}, std::pair<size_t, Operand>{4, unbiased}}) {
        const Operand& running = cx.in(n, i);
        const c10::ScalarType rt = accumulation_type(running.dtype);
        const Operand kept = cx.binary("stablehlo.multiply", cx.as(running, rt), keep, rt);
        const Operand added = cx.binary("stablehlo.multiply", cx.as(batch, rt), momentum, rt);
        Operand updated = cx.as(cx.binary("stablehlo.add", kept, added, rt), running.dtype);
        cx.update_input(n->input(i), std::move(updated));
      }
    }
  } else {
    norm_mean = cx.as(cx.in(n, 3), t);
    norm_invstd = cx.unary("stablehlo.rsqrt", cx.add(cx.as(cx.in(n, 4), t), cx.as(cx.in(n, 7), t)));
    cx.set(n, 1, cx.splat(0, cx.out_dims(n, 1), cx.out_dtype(n, 1)));
    cx.set(n, 2, cx.splat(0, cx.out_dims(n, 2), cx.out_dtype(n, 2)));
  }
  // x * alpha + beta per channel, alpha = invstd * weight, beta = bias - mean * alpha: libtorch's
  // formula (batch_norm_cpu_transform_input).
  const Operand alpha = cx.none_arg(n, 1) ? norm_invstd : cx.mul(norm_invstd, cx.as(cx.in(n, 1), t));
  Operand beta = cx.op("stablehlo.negate", {cx.mul(norm_mean, alpha)}, alpha.dims, t);
  if (!cx.none_arg(n, 2)) beta = cx.add(beta, cx.as(cx.in(n, 2), t));
  cx.set(n, 0, cx.as(cx.add(cx.mul(x, along_channels(cx, alpha, x.dims)), along_channels(cx, beta, x.dims)), out_t));
}

// (grad_out, input, weight?, running_mean?, running_var?, save_mean?, save_invstd?, train, eps,
// output_mask) -> (grad_input, grad_weight, grad_bias) with x_hat = (x - mean) * invstd (the
// saved statistics in training, the running ones otherwise), over N and the spatial dims:
// grad_bias = sum(g), grad_weight = sum(g * x_hat); grad_input = weight * invstd * (g - mean(g) -
// x_hat * mean(g * x_hat)) in training, g * weight * invstd in evaluation.
void native_batch_norm_backward(LoweringContext& cx, const Node* n) {
  const std::vector<bool> mask = cx.constant(n, 9, "output_mask").toBoolList().vec();
  if (mask.size() != 3) throw std::invalid_argument("bad native_batch_norm_backward output_mask");
  const bool train = cx.bool_arg(n, 7, "train");
  const bool has_weight = !cx.none_arg(n, 2);
  for (size_t i = 0; i < 3; ++i) {
    const bool defined = mask[i] && (i != 1 || has_weight);
    if (!defined && cx.used(n->output(i))) throw Unsupported{"a use of undefined output " + std::to_string(i)};
  }
  const c10::ScalarType t = accumulation_type(cx.in(n, 1).dtype);  // float32 for 16-bit floats, as the forward
  const Operand grad = cx.as(cx.in(n, 0), t), x = cx.as(cx.in(n, 1), t);
  if (x.dims.size() < 2) throw Unsupported{"input of " + std::to_string(x.dims.size()) + " dimensions"};
  const Dims others = all_but_channels(x.dims);
  const int64_t count = elements_per_channel(x.dims);
  Operand mean, invstd;
  if (train) {
    if (cx.none_arg(n, 5) || cx.none_arg(n, 6)) throw Unsupported{"training without saved statistics"};
    mean = cx.as(cx.in(n, 5), t);
    invstd = cx.as(cx.in(n, 6), t);
  } else {
    if (cx.none_arg(n, 3) || cx.none_arg(n, 4)) throw Unsupported{"evaluation without running statistics"};
    mean = cx.as(cx.in(n, 3), t);
    invstd = cx.unary("stablehlo.rsqrt", cx.add(cx.as(cx.in(n, 4), t), cx.as(cx.in(n, 8), t)));
  }
  const Operand x_hat = cx.mul(cx.binary("stablehlo.subtract", x, along_channels(cx, mean, x.dims), t),
                               along_channels(cx, invstd, x.dims));
  const Operand sum_g = cx.reduce(grad, others, "stablehlo.add", 0);
  const Operand sum_gx = cx.reduce(cx.mul(grad, x_hat), others, "stablehlo.add", 0);
  if (mask[0]) {
    const Operand scale = has_weight ? cx.mul(invstd, cx.as(cx.in(n, 2), t)) : invstd;
    Operand g = grad;
    if (train) {
      const Operand mean_g = cx.binary("stablehlo.divide", sum_g, number(count), t);
      const Operand mean_gx = cx.binary("stablehlo.divide", sum_gx, number(count), t);
      const Operand centered = cx.binary("stablehlo.subtract", grad, along_channels(cx, mean_g, x.dims), t);
      g = cx.binary("stablehlo.subtract", centered, cx.mul(x_hat, along_channels(cx, mean_gx, x.dims)), t);
    }
    cx.set(n, 0, cx.as(cx.mul(g, along_channels(cx, scale, x.dims)), cx.out_dtype(n, 0)));
  }
  if (mask[1] && has_weight) cx.set(n, 1, cx.as(sum_gx, cx.out_dtype(n, 1)));
  if (mask[2]) cx.set(n, 2, cx.as(sum_g, cx.out_dtype(n, 2)));
}

}  // namespace

void add_norm_rules(RuleTable& table) {
  table.add("aten::native_layer_norm", native_layer_norm, "StableHlo.NativeLayerNormWithAndWithoutAffine");
  table.add("aten::native_layer_norm_backward", native_layer_norm_backward, "StableHlo.NativeLayerNormBackward");
  table.add("aten::native_batch_norm", native_batch_norm,
            "StableHlo.BatchNormTrainsEvaluatesAndUpdatesItsRunningStatistics");
  table.add("aten::native_batch_norm_backward", native_batch_norm_backward,
            "StableHlo.BatchNormTrainsEvaluatesAndUpdatesItsRunningStatistics");
}

}  // namespace fulgur::xla::stablehlo
