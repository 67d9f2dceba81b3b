// SPDX-License-Identifier: Apache-2.0
// Convolution rules: convolution and convolution_backward, plain and transposed, as
// stablehlo.convolution ops (the generic rules), and two platform rules of the CPU plugin:
// host_kernels (EmitOptions::host_convolutions) makes float32 and float64 plain convolutions and
// their gradients custom calls of libtorch's kernels (xla/host_kernels.h); xla_cpu
// (EmitOptions::xla_cpu) writes a convolution of one input feature as a sum of shifted windows.

#include "xla/stablehlo/lowering.h"

#include "xla/host_kernels.h"

namespace fulgur::xla::stablehlo {
namespace {

// "[b, f, 0, 1]"-style layouts: `first`, `second`, then the spatial dims.
std::string conv_layout(const char* first, const char* second, size_t spatial) {
  std::string s = std::string("[") + first + ", " + second;
  for (size_t i = 0; i < spatial; ++i) s += ", " + std::to_string(i);
  return s + "]";
}

// The most kernel taps (product of the kernel's spatial sizes) a convolution of one input
// feature is written as a shifted sum for: 5x5 is the case measured (bench/history/libtorch-1.13.md); the
// program grows by six ops per tap.
constexpr int64_t kMaxShiftedSumTaps = 25;


// A stablehlo.convolution; `layout` is its dimension_numbers, spatial dims 0..rank-3.
Operand conv(LoweringContext& cx, const Operand& lhs, const Operand& rhs, const std::string& layout, const Dims& dims,
                      const Dims& strides, const std::vector<std::pair<int64_t, int64_t>>& padding,
                      const Dims& lhs_dilation, const Dims& rhs_dilation, int64_t feature_groups) {
  std::string pad = "dense<[";
  for (size_t i = 0; i < padding.size(); ++i)
    pad += (i ? ", [" : "[") + std::to_string(padding[i].first) + ", " + std::to_string(padding[i].second) + "]";
  pad += "]> : tensor<" + std::to_string(padding.size()) + "x2xi64>";
  return cx.op("stablehlo.convolution", {lhs, rhs}, dims, lhs.dtype,
            "batch_group_count = 1 : i64, dimension_numbers = #stablehlo.conv<" + layout +
                ">, feature_group_count = " + std::to_string(feature_groups) + " : i64, lhs_dilation = " +
                i64_array(lhs_dilation) + ", padding = " + pad + ", rhs_dilation = " + i64_array(rhs_dilation) +
                ", window_strides = " + i64_array(strides));
}

// out[b, o, p] = sum over taps k of x_padded[b, 0, p * stride + k * dilation] * w[o, 0, k]: each
// tap a strided slice of the padded input broadcast over the output features, times the tap's
// column of weights broadcast over batch and space, the products added in tap order. XLA fuses
// the whole sum (and the bias and activation after it) into one elementwise loop.
Operand conv_as_shifted_sum(LoweringContext& cx, const Operand& x, const Operand& w, const Dims& dims,
                            const Dims& stride,
                                     const Dims& padding, const Dims& dilation) {
  const size_t spatial = x.dims.size() - 2;
  const int64_t rank = static_cast<int64_t>(x.dims.size());
  Dims low = {0, 0}, interior(x.dims.size(), 0), padded = x.dims;
  for (size_t i = 0; i < spatial; ++i) {
    low.push_back(padding[i]);
    padded[i + 2] += 2 * padding[i];
  }
  const Operand xp = cx.op("stablehlo.pad", {x, cx.splat(0, {}, x.dtype)}, padded, x.dtype,
                        "edge_padding_high = " + i64_array(low) + ", edge_padding_low = " + i64_array(low) +
                            ", interior_padding = " + i64_array(interior));
  int64_t taps = 1;
  for (size_t i = 0; i < spatial; ++i) taps *= w.dims[i + 2];
  const int64_t features = w.dims[0];
  const Operand columns = cx.reshape(w, {features, taps});
  Dims all(x.dims.size());
  for (int64_t d = 0; d < rank; ++d) all[d] = d;
  Dims window = dims;
  window[1] = 1;
  Operand sum;
  for (int64_t k = 0; k < taps; ++k) {
    Dims start = {0, 0}, limit = {x.dims[0], 1}, steps = {1, 1};
    int64_t rest = k;
    Dims offset(spatial);
    for (size_t i = spatial; i-- > 0;) {
      offset[i] = rest % w.dims[i + 2];
      rest /= w.dims[i + 2];
    }
    for (size_t i = 0; i < spatial; ++i) {
      start.push_back(offset[i] * dilation[i]);
      limit.push_back(start.back() + (dims[i + 2] - 1) * stride[i] + 1);
      steps.push_back(stride[i]);
    }
    const Operand shifted = cx.op("stablehlo.slice", {xp}, window, x.dtype,
                               "limit_indices = " + i64_array(limit) + ", start_indices = " + i64_array(start) +
                                   ", strides = " + i64_array(steps));
    const Operand tap = cx.op("stablehlo.slice", {columns}, {features, 1}, x.dtype,
                           "limit_indices = " + i64_array({features, k + 1}) + ", start_indices = " +
                               i64_array({0, k}) + ", strides = " + i64_array({1, 1}));
    const Operand product =
        cx.mul(cx.op("stablehlo.broadcast_in_dim", {shifted}, dims, x.dtype, "broadcast_dimensions = " + i64_array(all)),
            cx.op("stablehlo.broadcast_in_dim", {tap}, dims, x.dtype, "broadcast_dimensions = array<i64: 1, 0>"));
    sum = k == 0 ? product : cx.add(sum, product);
  }
  return sum;
}

// A stablehlo.custom_call of host kernel `target` (xla/host_kernels.h) with the window of a
// convolution node as its attributes, plus `extra` ("name = value, ").
std::vector<Operand> host_call(LoweringContext& cx, const char* target, const std::vector<Operand>& args,
                                        const std::vector<std::pair<Dims, c10::ScalarType>>& results,
                                        const Dims& stride, const Dims& padding, const Dims& dilation, int64_t groups,
                                        const std::string& extra) {
  const std::string attrs = std::string("call_target_name = \"") + target +
                            "\", api_version = 4 : i32, backend_config = {" + extra +
                            "stride = " + i64_array(stride) + ", padding = " + i64_array(padding) +
                            ", dilation = " + i64_array(dilation) + ", groups = " + std::to_string(groups) + " : i64}";
  if (results.size() == 1) return {cx.op("stablehlo.custom_call", args, results[0].first, results[0].second, attrs)};
  return cx.op_n("stablehlo.custom_call", args, results, attrs, "");
}

// grad_output convolved back onto an input of `in_dims`: grad dilated by the stride and padded,
// convolved with the kernel `w` reversed in space (`w`'s first dim contracted with grad's
// features, its second giving the result's; `groups` feature groups). A convolution's input
// gradient, and a transposed convolution's forward.
Operand input_gradient(LoweringContext& cx, const Operand& grad, const Operand& w, const Dims& in_dims,
                       const Dims& stride, const Dims& padding, const Dims& dilation, int64_t groups) {
  const size_t spatial = in_dims.size() - 2;
  Dims spatial_dims;
  for (size_t i = 0; i < spatial; ++i) spatial_dims.push_back(static_cast<int64_t>(i + 2));
  std::vector<std::pair<int64_t, int64_t>> pads;
  for (size_t i = 0; i < spatial; ++i) {
    const int64_t extent = dilation[i] * (w.dims[i + 2] - 1);
    const int64_t lo = extent - padding[i];
    const int64_t hi = in_dims[i + 2] - 1 - (grad.dims[i + 2] - 1) * stride[i] - lo + extent;
    pads.emplace_back(lo, hi);
  }
  const Operand flipped = cx.op("stablehlo.reverse", {w}, w.dims, w.dtype, "dimensions = " + i64_array(spatial_dims));
  const std::string layout = conv_layout("b", "f", spatial) + "x" + conv_layout("i", "o", spatial) + "->" +
                             conv_layout("b", "f", spatial);
  return conv(cx, grad, flipped, layout, in_dims, Dims(spatial, 1), pads, stride, dilation, groups);
}

// The weight gradient of a convolution of `x` that made `grad`: x convolved with grad over the
// batch (batch and features exchanged), [grad's features, x's features, kernel...].
Operand weight_gradient(LoweringContext& cx, const Operand& x, const Operand& grad, const Dims& w_dims,
                        const Dims& stride, const Dims& padding, const Dims& dilation) {
  const size_t spatial = x.dims.size() - 2;
  std::vector<std::pair<int64_t, int64_t>> pads;
  for (size_t i = 0; i < spatial; ++i) {
    const int64_t hi =
        (w_dims[i + 2] - 1) * dilation[i] + (grad.dims[i + 2] - 1) * stride[i] + 1 - x.dims[i + 2] - padding[i];
    pads.emplace_back(padding[i], hi);
  }
  const std::string layout = conv_layout("f", "b", spatial) + "x" + conv_layout("i", "o", spatial) + "->" +
                             conv_layout("f", "b", spatial);
  return conv(cx, x, grad, layout, w_dims, dilation, pads, Dims(spatial, 1), stride, 1);
}

// A plain convolution in PyTorch's NCHW / OIHW layout (XLA's layout assignment moves the
// features minor for Eigen by itself).
Operand forward_conv(LoweringContext& cx, const Operand& x, const Operand& w, const Dims& dims, const Dims& stride,
                     const Dims& padding, const Dims& dilation, int64_t groups) {
  const size_t spatial = x.dims.size() - 2;
  std::vector<std::pair<int64_t, int64_t>> pads;
  for (int64_t p : padding) pads.emplace_back(p, p);
  const std::string layout = conv_layout("b", "f", spatial) + "x" + conv_layout("o", "i", spatial) + "->" +
                             conv_layout("b", "f", spatial);
  return conv(cx, x, w, layout, dims, stride, pads, Dims(spatial, 1), dilation, groups);
}

// A transposed convolution (nn::ConvTranspose2d) is the input gradient of the convolution it
// transposes: `x` dilated by the stride (lhs_dilation), padded by dilation * (k - 1) - padding
// on each side plus output_padding on the high side, convolved with the kernel reversed. Its
// weight is [in, out / groups, k...]; with groups it is regrouped to [in / groups, out, k...]
// (feature_group_count takes the groups' input features side by side).
Operand transposed_conv(LoweringContext& cx, const Operand& x, const Operand& w, const Dims& dims, const Dims& stride,
                        const Dims& padding, const Dims& dilation, int64_t groups) {
  if (groups == 1) return input_gradient(cx, x, w, dims, stride, padding, dilation, 1);
  const size_t spatial = x.dims.size() - 2;
  const int64_t in = w.dims[0], out = w.dims[1];
  Dims split = {groups, in / groups, out}, moved = {in / groups, groups, out}, regrouped = {in / groups, groups * out};
  Dims order = {1, 0, 2};
  for (size_t i = 0; i < spatial; ++i) {
    split.push_back(w.dims[i + 2]);
    moved.push_back(w.dims[i + 2]);
    regrouped.push_back(w.dims[i + 2]);
    order.push_back(static_cast<int64_t>(i + 3));
  }
  const Operand moved_kernel =
      cx.op("stablehlo.transpose", {cx.reshape(w, split)}, moved, w.dtype, "permutation = " + i64_array(order));
  const Operand kernel = cx.reshape(moved_kernel, regrouped);
  return input_gradient(cx, x, kernel, dims, stride, padding, dilation, groups);
}

// The window arguments of a convolution node whose input is argument `input` and whose stride
// is argument `first`: (stride, padding, dilation, transposed, output_padding, groups) from there.
struct Window {
  size_t spatial;
  Dims stride, padding, dilation;
  bool transposed;
  int64_t groups;
};

Window window_of(const LoweringContext& cx, const Node* n, size_t input, size_t first) {
  Window w;
  w.spatial = cx.in(n, input).dims.size() - 2;
  w.stride = cx.spatial_arg(n, first, "stride", w.spatial, {1});
  w.padding = cx.spatial_arg(n, first + 1, "padding", w.spatial, {0});
  w.dilation = cx.spatial_arg(n, first + 2, "dilation", w.spatial, {1});
  w.transposed = cx.bool_arg(n, first + 3, "transposed");
  w.groups = cx.int_arg(n, first + 5, "groups");
  return w;
}

bool float32_or_64(c10::ScalarType t) { return t == c10::kFloat || t == c10::kDouble; }

// `out` plus the bias of a convolution node (argument 2), if it has one.
Operand with_bias(LoweringContext& cx, const Node* n, const Operand& out) {
  if (cx.none_arg(n, 2)) return out;
  return cx.add(out, cx.op("stablehlo.broadcast_in_dim", {cx.as(cx.in(n, 2), out.dtype)}, out.dims, out.dtype,
                           "broadcast_dimensions = array<i64: 1>"));
}

// (input, weight, bias?, stride, padding, dilation, transposed, output_padding, groups): one
// stablehlo.convolution in PyTorch's NCHW / OIHW layout (forward_conv, transposed_conv), plus
// the bias.
void convolution(LoweringContext& cx, const Node* n) {
  const c10::ScalarType t = cx.out_dtype(n);
  const Operand x = cx.as(cx.in(n, 0), t), w = cx.as(cx.in(n, 1), t);
  const Window win = window_of(cx, n, 0, 3);
  const Operand out =
      win.transposed ? transposed_conv(cx, x, w, cx.out_dims(n), win.stride, win.padding, win.dilation, win.groups)
                     : forward_conv(cx, x, w, cx.out_dims(n), win.stride, win.padding, win.dilation, win.groups);
  cx.set(n, 0, with_bias(cx, n, out));
}

// Platform host_kernels: a float32 or float64 plain convolution as a custom call of libtorch's
// kernel (transposed ones are left to the generic rule).
bool host_convolution(LoweringContext& cx, const Node* n) {
  const c10::ScalarType t = cx.out_dtype(n);
  const Window win = window_of(cx, n, 0, 3);
  if (!float32_or_64(t) || win.transposed) return false;
  std::vector<Operand> args{cx.as(cx.in(n, 0), t), cx.as(cx.in(n, 1), t)};
  if (!cx.none_arg(n, 2)) args.push_back(cx.as(cx.in(n, 2), t));
  cx.set(n, 0, host_call(cx, host_kernels::kConvolution, args, {{cx.out_dims(n), t}}, win.stride, win.padding,
                         win.dilation, win.groups, "")[0]);
  return true;
}

// Platform xla_cpu: a convolution of one input feature (the MNIST CNN's first) with groups 1, at
// most kMaxShiftedSumTaps taps and a float32 or float64 result as a shifted sum
// (conv_as_shifted_sum): XLA:CPU runs a stablehlo.convolution as Eigen's spatial convolution,
// whose contraction over 1 x 5 x 5 values per output is 4-5x slower than the shifted sum's one
// fused loop on the CNN's conv1 (bench/history/libtorch-1.13.md, `xla_op_bench`).
bool shifted_sum_convolution(LoweringContext& cx, const Node* n) {
  const c10::ScalarType t = cx.out_dtype(n);
  const Window win = window_of(cx, n, 0, 3);
  const Dims& x_dims = cx.in(n, 0).dims;
  const Dims& w_dims = cx.in(n, 1).dims;
  int64_t taps = 1;
  for (size_t i = 0; i < win.spatial; ++i) taps *= w_dims[i + 2];
  if (win.transposed || x_dims[1] != 1 || win.groups != 1 || taps > kMaxShiftedSumTaps || !float32_or_64(t))
    return false;
  const Operand out = conv_as_shifted_sum(cx, cx.as(cx.in(n, 0), t), cx.as(cx.in(n, 1), t), cx.out_dims(n), win.stride,
                                          win.padding, win.dilation);
  cx.set(n, 0, with_bias(cx, n, out));
  return true;
}

// The output mask of a convolution_backward node; Unsupported where an output it leaves
// undefined is used.
std::vector<bool> output_mask(const LoweringContext& cx, const Node* n) {
  const std::vector<bool> mask = cx.constant(n, 10, "output_mask").toBoolList().vec();
  for (size_t i = 0; i < 3; ++i)
    if (!mask.at(i) && cx.used(n->output(i))) throw Unsupported{"a use of undefined output " + std::to_string(i)};
  return mask;
}

// (grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed, output_padding,
// groups, output_mask) -> (grad_input, grad_weight, grad_bias), as JAX differentiates a
// convolution: grad_input is grad_output dilated by the stride, convolved with the kernel
// reversed in space and its feature dims swapped (input_gradient); grad_weight convolves the
// input with grad_output over the batch (weight_gradient); grad_bias sums grad_output over all
// but its features. A transposed convolution's are the same with the roles exchanged: its
// grad_input is grad_output convolved with the weight (a plain convolution), its grad_weight
// the weight gradient of that convolution of grad_output. Outputs the mask leaves undefined
// must be unused.
void convolution_backward(LoweringContext& cx, const Node* n) {
  const c10::ScalarType t = cx.out_dtype(n, 1);
  const Operand grad = cx.as(cx.in(n, 0), t), x = cx.as(cx.in(n, 1), t), w = cx.as(cx.in(n, 2), t);
  const Window win = window_of(cx, n, 1, 4);
  if (win.groups != 1) throw Unsupported{"groups " + std::to_string(win.groups)};
  const std::vector<bool> mask = output_mask(cx, n);
  if (mask[0])
    cx.set(n, 0, win.transposed ? forward_conv(cx, grad, w, x.dims, win.stride, win.padding, win.dilation, 1)
                                : input_gradient(cx, grad, w, x.dims, win.stride, win.padding, win.dilation, 1));
  if (mask[1])
    cx.set(n, 1, win.transposed ? weight_gradient(cx, grad, x, w.dims, win.stride, win.padding, win.dilation)
                                : weight_gradient(cx, x, grad, w.dims, win.stride, win.padding, win.dilation));
  if (mask[2]) {
    Dims dims = {0};
    for (size_t i = 0; i < win.spatial; ++i) dims.push_back(static_cast<int64_t>(i + 2));
    // Summed in float32 for 16-bit floats, as at::sum.
    const Operand sum = cx.reduce(cx.as(grad, accumulation_type(t)), dims, "stablehlo.add", 0);
    cx.set(n, 2, cx.reshape(cx.as(sum, cx.out_dtype(n, 2)), cx.out_dims(n, 2)));
  }
}

// Platform host_kernels: the gradients of a float32 or float64 plain convolution of groups 1 as
// one custom call of libtorch's kernel, the outputs the mask asks for.
bool host_convolution_backward(LoweringContext& cx, const Node* n) {
  const c10::ScalarType t = cx.out_dtype(n, 1);
  const Window win = window_of(cx, n, 1, 4);
  if (!float32_or_64(t) || win.transposed || win.groups != 1) return false;
  const std::vector<bool> mask = output_mask(cx, n);
  std::vector<std::pair<Dims, c10::ScalarType>> results;
  for (size_t i = 0; i < 3; ++i)
    if (mask[i]) results.emplace_back(cx.out_dims(n, i), t);
  const Dims flags{int64_t{mask[0]}, int64_t{mask[1]}, int64_t{mask[2]}};
  const auto outs = host_call(cx, host_kernels::kConvolutionBackward,
                              {cx.as(cx.in(n, 0), t), cx.as(cx.in(n, 1), t), cx.as(cx.in(n, 2), t)}, results,
                              win.stride, win.padding, win.dilation, 1, "output_mask = " + i64_array(flags) + ", ");
  for (size_t i = 0, j = 0; i < 3; ++i)
    if (mask[i]) cx.set(n, i, outs[j++]);
  return true;
}

}  // namespace

void add_conv_rules(RuleTable& table) {
  table.add("aten::convolution", convolution, "StableHlo.ConvolutionAndItsBackward");
  table.add("aten::convolution_backward", convolution_backward, "StableHlo.ConvolutionAndItsBackward");
  table.add_platform("aten::convolution", Platform::host_kernels, host_convolution);
  table.add_platform("aten::convolution_backward", Platform::host_kernels, host_convolution_backward);
  table.add_platform("aten::convolution", Platform::xla_cpu, shifted_sum_convolution);
}

}  // namespace fulgur::xla::stablehlo
