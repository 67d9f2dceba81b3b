// SPDX-License-Identifier: Apache-2.0
// Upsampling rules over the last two dims of a [N, C, H, W] or [C, H, W] input:
// upsample_nearest2d and its backward for whole factors (other factors stay on TorchScript), and
// upsample_bilinear2d and its backward (align_corners true and false, any sizes) as products with
// interpolation matrices.

#include "xla/stablehlo/lowering.h"

#include <algorithm>
#include <cmath>
#include <optional>

namespace fulgur::xla::stablehlo {
namespace {

// The whole factor by which upsample_nearest2d maps `in` rows to `out` (output row d reads input
// row d / factor), computed as libtorch's CPU kernel picks source rows (nearest_idx: the
// identity, d >> 1 for twice the size, else min(floor(d * scale), in - 1) in float with scale
// 1 / scales or in / out); throws Unsupported where that is not a whole-factor repeat.
int64_t nearest_factor(int64_t in, int64_t out, std::optional<double> scales) {
  if (in <= 0 || out % in != 0) throw Unsupported{"upsampling " + std::to_string(in) + " to " + std::to_string(out)};
  const int64_t factor = out / in;
  if (factor == 1 || factor == 2) return factor;
  const float scale = scales && *scales > 0 ? static_cast<float>(1.0 / *scales)
                                            : static_cast<float>(in) / static_cast<float>(out);
  for (int64_t d = 0; d < out; ++d) {
    const int64_t src = std::min(static_cast<int64_t>(std::floor(static_cast<float>(d) * scale)), in - 1);
    if (src != d / factor) throw Unsupported{"scale " + std::to_string(scale) + " is not a whole-factor repeat"};
  }
  return factor;
}

std::optional<double> optional_double(LoweringContext& cx, const Node* n, size_t i) {
  if (cx.none_arg(n, i)) return std::nullopt;
  return cx.constant(n, i, "scales").toDouble();
}

// (self [N, C, H, W] or [C, H, W], output_size, scales_h?, scales_w?): each element repeated fh x
// fw times (nearest_factor): reshaped to [.., H, 1, W, 1], broadcast to [.., H, fh, W, fw],
// reshaped to [.., H * fh, W * fw].
void upsample_nearest2d(LoweringContext& cx, const Node* n) {
  const Operand x = cx.materialized(cx.in(n, 0));
  if (x.dims.size() != 3 && x.dims.size() != 4) throw Unsupported{"an input of " + std::to_string(x.dims.size()) + " dims"};
  const Dims out = cx.ints_arg(n, 1, "output_size");
  if (out.size() != 2) throw Unsupported{"output_size of " + std::to_string(out.size()) + " values"};
  const size_t h = x.dims.size() - 2;
  const int64_t H = x.dims[h], W = x.dims[h + 1];
  const int64_t fh = nearest_factor(H, out[0], optional_double(cx, n, 2)),
                fw = nearest_factor(W, out[1], optional_double(cx, n, 3));
  Dims lead(x.dims.begin(), x.dims.begin() + static_cast<std::ptrdiff_t>(h));
  Dims unit = lead, spread = lead;
  unit.insert(unit.end(), {H, 1, W, 1});
  spread.insert(spread.end(), {H, fh, W, fw});
  cx.set(n, 0, cx.reshape(cx.broadcast_to(cx.reshape(x, unit), spread), cx.out_dims(n)));
}

// (grad_output, output_size, input_size, scales_h?, scales_w?): the sum of each input element's
// fh x fw copies, in float32 for 16-bit floats, rounded once.
void upsample_nearest2d_backward(LoweringContext& cx, const Node* n) {
  const c10::ScalarType out = cx.out_dtype(n), t = accumulation_type(out);
  const Operand g = cx.as(cx.materialized(cx.in(n, 0)), t);
  const Dims output_size = cx.ints_arg(n, 1, "output_size"), input_size = cx.ints_arg(n, 2, "input_size");
  if (output_size.size() != 2 || (input_size.size() != 3 && input_size.size() != 4))
    throw Unsupported{"sizes of " + std::to_string(output_size.size()) + " and " + std::to_string(input_size.size())};
  const size_t h = input_size.size() - 2;
  const int64_t H = input_size[h], W = input_size[h + 1];
  const int64_t fh = nearest_factor(H, output_size[0], optional_double(cx, n, 3)),
                fw = nearest_factor(W, output_size[1], optional_double(cx, n, 4));
  Dims spread(input_size.begin(), input_size.begin() + static_cast<std::ptrdiff_t>(h));
  spread.insert(spread.end(), {H, fh, W, fw});
  const Operand sums = cx.reduce(cx.reshape(g, spread), {static_cast<int64_t>(h) + 1, static_cast<int64_t>(h) + 3},
                                 "stablehlo.add", 0);
  cx.set(n, 0, cx.reshape(cx.as(sums, out), cx.out_dims(n)));
}

// upsample_bilinear2d's source rows along one dim: output row d reads input rows i0[d] and
// i1[d] with weights 1 - lambda[d] and lambda[d] (i1 = i0 at the last input row), computed as
// libtorch's CPU kernel computes them (area_pixel_compute_scale and _source_index,
// guard_index_and_lambda) in its opmath type `Acc` (float, double for a double input).
struct Taps {
  Dims i0, i1;
  std::vector<double> lambda;
  // The [out, in] matrix of the weights (each row's two taps).
  std::vector<double> matrix(int64_t in) const {
    std::vector<double> m(i0.size() * static_cast<size_t>(in), 0.0);
    for (size_t d = 0; d < i0.size(); ++d) {
      m[d * static_cast<size_t>(in) + static_cast<size_t>(i0[d])] += 1.0 - lambda[d];
      m[d * static_cast<size_t>(in) + static_cast<size_t>(i1[d])] += lambda[d];
    }
    return m;
  }
};

template <typename Acc>
Taps bilinear_taps(int64_t in, int64_t out, bool align_corners, std::optional<double> scales) {
  Acc scale;
  if (align_corners)
    scale = out > 1 ? static_cast<Acc>(in - 1) / static_cast<Acc>(out - 1) : Acc(0);
  else
    scale = scales && *scales > 0 ? static_cast<Acc>(1.0 / *scales) : static_cast<Acc>(in) / static_cast<Acc>(out);
  Taps taps;
  for (int64_t d = 0; d < out; ++d) {
    Acc src = align_corners ? scale * static_cast<Acc>(d) : scale * (static_cast<Acc>(d) + Acc(0.5)) - Acc(0.5);
    if (!align_corners && src < 0) src = 0;
    const int64_t i0 = std::min(static_cast<int64_t>(std::floor(src)), in - 1);
    taps.i0.push_back(i0);
    taps.i1.push_back(i0 + (i0 < in - 1 ? 1 : 0));
    taps.lambda.push_back(static_cast<double>(std::min(std::max(src - static_cast<Acc>(i0), Acc(0)), Acc(1))));
  }
  return taps;
}

// The taps along a dim of `in` rows read by `out`, in the opmath type of `t`.
Taps taps_of(int64_t in, int64_t out, bool align_corners, std::optional<double> scales, c10::ScalarType t) {
  return t == c10::kDouble ? bilinear_taps<double>(in, out, align_corners, scales)
                           : bilinear_taps<float>(in, out, align_corners, scales);
}

// A constant of `dims` and `t` holding `values` in row-major order.
Operand dense(LoweringContext& cx, const std::vector<double>& values, const Dims& dims, c10::ScalarType t) {
  std::string text = "[";
  const int64_t inner = dims.size() == 2 ? dims[1] : 1;
  for (size_t k = 0; k < values.size(); ++k) {
    if (dims.size() == 2 && k % static_cast<size_t>(inner) == 0) text += k ? "], [" : "[";
    else if (k) text += ", ";
    text += literal(values[k], t);
  }
  text += dims.size() == 2 && !values.empty() ? "]]" : "]";
  return cx.op("stablehlo.constant", {}, dims, t, "value = dense<" + text + "> : " + mlir_type(dims, t));
}

// The rows `rows` of `x` [P, H, W] along `axis` (1 or 2): one stablehlo.gather.
Operand take(LoweringContext& cx, const Operand& x, int64_t axis, const Dims& rows) {
  const int64_t k = static_cast<int64_t>(rows.size());
  std::vector<double> values(rows.begin(), rows.end());
  const Operand index = dense(cx, values, {k, 1}, c10::kLong);
  Dims dims = x.dims, slice = x.dims;
  dims[axis] = k;
  slice[axis] = 1;
  const std::string offsets = axis == 1 ? "0, 2" : "0, 1";
  return cx.op("stablehlo.gather", {x, index}, dims, x.dtype,
               "dimension_numbers = #stablehlo.gather<offset_dims = [" + offsets + "], collapsed_slice_dims = [" +
                   std::to_string(axis) + "], start_index_map = [" + std::to_string(axis) +
                   "], index_vector_dim = 1>, slice_sizes = " + i64_array(slice) + ", indices_are_sorted = false");
}

// x [P, H, W] interpolated along `axis`: (1 - lambda) * x[i0] + lambda * x[i1], each output row
// from its two taps only (as libtorch: an inf elsewhere in the row does not reach it).
Operand interpolate(LoweringContext& cx, const Operand& x, int64_t axis, const Taps& taps) {
  const int64_t k = static_cast<int64_t>(taps.i0.size());
  std::vector<double> keep(taps.lambda.size());
  for (size_t d = 0; d < keep.size(); ++d) keep[d] = 1.0 - taps.lambda[d];
  Dims dims = x.dims;
  dims[axis] = k;
  auto weights = [&](const std::vector<double>& w) {
    return cx.op("stablehlo.broadcast_in_dim", {dense(cx, w, {k}, x.dtype)}, dims, x.dtype,
                 "broadcast_dimensions = array<i64: " + std::to_string(axis) + ">");
  };
  return cx.add(cx.mul(weights(keep), take(cx, x, axis, taps.i0)),
                cx.mul(weights(taps.lambda), take(cx, x, axis, taps.i1)));
}

// The leading dims of a [N, C, H, W] or [C, H, W] shape flattened: [N * C or C, H, W].
Dims as_planes(const Dims& dims) {
  int64_t planes = 1;
  for (size_t i = 0; i + 2 < dims.size(); ++i) planes *= dims[i];
  return {planes, dims[dims.size() - 2], dims[dims.size() - 1]};
}

// (self, output_size, align_corners, scales_h?, scales_w?): each plane interpolated along W, then
// along H (libtorch's order), in float32 for 16-bit floats and rounded once.
void upsample_bilinear2d(LoweringContext& cx, const Node* n) {
  const c10::ScalarType out_t = cx.out_dtype(n), t = accumulation_type(out_t);
  const Operand x = cx.as(cx.materialized(cx.in(n, 0)), t);
  if (x.dims.size() != 3 && x.dims.size() != 4)
    throw Unsupported{"an input of " + std::to_string(x.dims.size()) + " dims"};
  const Dims out = cx.out_dims(n);
  const bool align = cx.bool_arg(n, 2, "align_corners");
  const Dims planes = as_planes(x.dims);
  const Taps h = taps_of(planes[1], out[out.size() - 2], align, optional_double(cx, n, 3), t);
  const Taps w = taps_of(planes[2], out[out.size() - 1], align, optional_double(cx, n, 4), t);
  const Operand y = interpolate(cx, interpolate(cx, cx.reshape(x, planes), 2, w), 1, h);
  cx.set(n, 0, cx.as(cx.reshape(y, out), out_t));
}

// (grad_output, output_size, input_size, align_corners, scales_h?, scales_w?): each input row
// gets the sum of the gradients of the output rows that read it, weighted: grad_input =
// Ah^T . grad . Aw per plane with the [out, in] weight matrices of the taps, two dots. (A
// non-finite gradient therefore reaches its whole row and column as NaN, where libtorch's
// scatter keeps it to its taps.)
void upsample_bilinear2d_backward(LoweringContext& cx, const Node* n) {
  const c10::ScalarType out_t = cx.out_dtype(n), t = accumulation_type(out_t);
  const Operand g = cx.as(cx.materialized(cx.in(n, 0)), t);
  const Dims input_size = cx.ints_arg(n, 2, "input_size");
  if (input_size.size() != 3 && input_size.size() != 4)
    throw Unsupported{"an input_size of " + std::to_string(input_size.size()) + " dims"};
  const bool align = cx.bool_arg(n, 3, "align_corners");
  const Dims planes = as_planes(input_size), grad_planes = as_planes(g.dims);
  const Operand ah = dense(cx, taps_of(planes[1], grad_planes[1], align, optional_double(cx, n, 4), t).matrix(planes[1]),
                           {grad_planes[1], planes[1]}, t);
  const Operand aw = dense(cx, taps_of(planes[2], grad_planes[2], align, optional_double(cx, n, 5), t).matrix(planes[2]),
                           {grad_planes[2], planes[2]}, t);
  const Operand rows = cx.dot(cx.reshape(g, grad_planes), aw, {}, 2, 0, t);  // [P, Ho, W]
  const Operand both = cx.dot(rows, ah, {}, 1, 0, t);                        // [P, W, H]
  const Operand planar =
      cx.op("stablehlo.transpose", {both}, {planes[0], planes[1], planes[2]}, t, "permutation = array<i64: 0, 2, 1>");
  cx.set(n, 0, cx.as(cx.reshape(planar, cx.out_dims(n)), out_t));
}

}  // namespace

void add_upsample_rules(RuleTable& table) {
  table.add("aten::upsample_nearest2d", upsample_nearest2d, "XlaOps.UpsampleNearestAndItsBackward");
  table.add("aten::upsample_nearest2d_backward", upsample_nearest2d_backward, "XlaOps.UpsampleNearestAndItsBackward");
  table.add("aten::upsample_bilinear2d", upsample_bilinear2d, "XlaOps.UpsampleBilinearBothAlignmentsAndItsBackward");
  table.add("aten::upsample_bilinear2d_backward", upsample_bilinear2d_backward,
            "XlaOps.UpsampleBilinearBothAlignmentsAndItsBackward");
}

}  // namespace fulgur::xla::stablehlo
