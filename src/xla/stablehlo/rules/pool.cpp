// Average pooling rules: avg_pool2d and _adaptive_avg_pool2d with their backwards, over the last
// two dims of a [N, C, H, W] or [C, H, W] input. Sums in float32 for 16-bit floats, each result
// rounded once.

#include "xla/stablehlo/lowering.h"

namespace fulgur::xla::stablehlo {
namespace {

// kernel_size, stride (empty: the kernel) and padding of a pool node, two values each.
struct Window {
  Dims kernel, stride, padding;
};

Dims two(const Dims& v, const char* what) {
  if (v.size() == 1) return {v[0], v[0]};
  if (v.size() != 2) throw Unsupported{std::string(what) + " of " + std::to_string(v.size()) + " values"};
  return v;
}

Window window_args(const LoweringContext& cx, const Node* n, size_t first) {
  Window w;
  w.kernel = two(cx.ints_arg(n, first, "kernel_size"), "kernel_size");
  const Dims stride = cx.ints_arg(n, first + 1, "stride");
  w.stride = stride.empty() ? w.kernel : two(stride, "stride");
  w.padding = two(cx.ints_arg(n, first + 2, "padding"), "padding");
  if (cx.bool_arg(n, first + 3, "ceil_mode")) throw Unsupported{"ceil_mode"};
  return w;
}

// A stablehlo.reduce_window summing `x` over windows of the last two dims.
Operand window_sum(LoweringContext& cx, const Operand& x, const Dims& kernel, const Dims& stride, const Dims& low,
                   const Dims& high, const Dims& out) {
  const size_t rank = x.dims.size();
  Dims window(rank, 1), strides(rank, 1);
  std::string pad = "dense<[";
  for (size_t i = 0; i < rank; ++i) {
    const bool spatial = i + 2 >= rank;
    if (spatial) {
      window[i] = kernel[i + 2 - rank];
      strides[i] = stride[i + 2 - rank];
    }
    pad += (i ? ", [" : "[") + std::to_string(spatial ? low[i + 2 - rank] : 0) + ", " +
           std::to_string(spatial ? high[i + 2 - rank] : 0) + "]";
  }
  pad += "]> : tensor<" + std::to_string(rank) + "x2xi64>";
  return cx.op("stablehlo.reduce_window", {cx.materialized(x), cx.splat(0, {}, x.dtype)}, out, x.dtype,
               "padding = " + pad + ", window_dimensions = " + i64_array(window) + ", window_strides = " +
                   i64_array(strides),
               cx.combiner("stablehlo.add", x.dtype));
}

// What each window of an avg_pool2d node (arguments from input `first`: kernel_size, stride,
// padding, ceil_mode, count_include_pad, divisor_override) divides its sum by, broadcast to
// `out`: divisor_override, or the window's size, or with count_include_pad false the number of
// its elements inside the input.
Operand divisor(LoweringContext& cx, const Node* n, size_t first, const Window& w, const Dims& in, const Dims& out,
                c10::ScalarType t) {
  if (!cx.none_arg(n, first + 5)) return cx.splat(cx.known_number(n, first + 5, "divisor_override"), out, t);
  if (cx.bool_arg(n, first + 4, "count_include_pad")) return cx.splat(w.kernel[0] * w.kernel[1], out, t);
  const size_t rank = in.size();
  const Dims plane = {in[rank - 2], in[rank - 1]}, out_plane = {out[rank - 2], out[rank - 1]};
  const Operand counts = window_sum(cx, cx.splat(1, plane, t), w.kernel, w.stride, w.padding, w.padding, out_plane);
  return cx.op("stablehlo.broadcast_in_dim", {counts}, out, t,
               "broadcast_dimensions = " + i64_array({static_cast<int64_t>(rank - 2), static_cast<int64_t>(rank - 1)}));
}

void check_rank(const Dims& dims) {
  if (dims.size() != 3 && dims.size() != 4) throw Unsupported{"an input of " + std::to_string(dims.size()) + " dims"};
}

// (self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override?)
void avg_pool2d(LoweringContext& cx, const Node* n) {
  const c10::ScalarType out_t = cx.out_dtype(n), t = accumulation_type(out_t);
  const Operand x = cx.as(cx.in(n, 0), t);
  check_rank(x.dims);
  const Window w = window_args(cx, n, 1);
  const Dims out = cx.out_dims(n);
  const Operand sum = window_sum(cx, x, w.kernel, w.stride, w.padding, w.padding, out);
  cx.set(n, 0, cx.as(cx.binary("stablehlo.divide", sum, divisor(cx, n, 1, w, x.dims, out, t), t), out_t));
}

// (grad, self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override?):
// each input element gets the sum of grad / divisor over the windows that hold it: grad spread
// `stride` apart (interior padding) and padded by kernel - 1 - padding, then summed over windows
// of the kernel's size at stride 1.
void avg_pool2d_backward(LoweringContext& cx, const Node* n) {
  const c10::ScalarType out_t = cx.out_dtype(n), t = accumulation_type(out_t);
  const Dims in = cx.out_dims(n);
  check_rank(in);
  const Window w = window_args(cx, n, 2);
  const Operand grad = cx.as(cx.in(n, 0), t);
  const Operand g = cx.binary("stablehlo.divide", grad, divisor(cx, n, 2, w, in, grad.dims, t), t);
  const size_t rank = in.size();
  Dims low(rank, 0), high(rank, 0), interior(rank, 0), padded = grad.dims;
  for (size_t i = 0; i < 2; ++i) {
    const size_t d = rank - 2 + i;
    low[d] = w.kernel[i] - 1 - w.padding[i];
    high[d] = in[d] + w.padding[i] - (grad.dims[d] - 1) * w.stride[i] - 1;
    interior[d] = w.stride[i] - 1;
    padded[d] = in[d] + w.kernel[i] - 1;
  }
  const Operand spread =
      cx.op("stablehlo.pad", {cx.materialized(g), cx.splat(0, {}, t)}, padded, t,
            "edge_padding_high = " + i64_array(high) + ", edge_padding_low = " + i64_array(low) +
                ", interior_padding = " + i64_array(interior));
  cx.set(n, 0, cx.as(window_sum(cx, spread, w.kernel, {1, 1}, {0, 0}, {0, 0}, in), out_t));
}

// The [out, in] 0/1 matrix of adaptive pooling's windows along one dim (window i covers
// [floor(i * in / out), ceil((i + 1) * in / out)), as libtorch's), and each window's length.
std::pair<Operand, std::vector<int64_t>> adaptive_windows(LoweringContext& cx, int64_t in, int64_t out,
                                                          c10::ScalarType t) {
  std::string rows;
  std::vector<int64_t> lengths;
  for (int64_t i = 0; i < out; ++i) {
    const int64_t start = i * in / out, end = ((i + 1) * in + out - 1) / out;
    lengths.push_back(end - start);
    rows += i ? ", [" : "[";
    for (int64_t j = 0; j < in; ++j) rows += std::string(j ? ", " : "") + (j >= start && j < end ? "1.0" : "0.0");
    rows += "]";
  }
  const Operand m = cx.op("stablehlo.constant", {}, {out, in}, t,
                          "value = dense<[" + rows + "]> : " + mlir_type({out, in}, t));
  return {m, lengths};
}

// The [..., Ho, Wo] window sizes of adaptive pooling, broadcast to `out`.
Operand adaptive_counts(LoweringContext& cx, const std::vector<int64_t>& rows, const std::vector<int64_t>& cols,
                        const Dims& out, c10::ScalarType t) {
  std::string text;
  for (size_t i = 0; i < rows.size(); ++i) {
    text += i ? ", [" : "[";
    for (size_t j = 0; j < cols.size(); ++j) text += (j ? ", " : "") + std::to_string(rows[i] * cols[j]) + ".0";
    text += "]";
  }
  const Dims plane = {static_cast<int64_t>(rows.size()), static_cast<int64_t>(cols.size())};
  const Operand c = cx.op("stablehlo.constant", {}, plane, t, "value = dense<[" + text + "]> : " + mlir_type(plane, t));
  const int64_t rank = static_cast<int64_t>(out.size());
  return cx.op("stablehlo.broadcast_in_dim", {c}, out, t, "broadcast_dimensions = " + i64_array({rank - 2, rank - 1}));
}

// `x` [..., a, b] with its last two dims swapped.
Operand swap_last_two(LoweringContext& cx, const Operand& x) {
  const size_t rank = x.dims.size();
  Dims perm, dims = x.dims;
  for (size_t i = 0; i < rank; ++i) perm.push_back(static_cast<int64_t>(i));
  std::swap(perm[rank - 2], perm[rank - 1]);
  std::swap(dims[rank - 2], dims[rank - 1]);
  return cx.op("stablehlo.transpose", {x}, dims, x.dtype, "permutation = " + i64_array(perm));
}

// (self, output_size): each output element the mean of its window; the window sums are two
// products with the 0/1 window matrices (rows, then columns), divided by the window sizes.
void adaptive_avg_pool2d(LoweringContext& cx, const Node* n) {
  const c10::ScalarType out_t = cx.out_dtype(n), t = accumulation_type(out_t);
  const Operand x = cx.as(cx.in(n, 0), t);
  check_rank(x.dims);
  const Dims out = cx.out_dims(n);
  const size_t rank = x.dims.size();
  const auto [mh, lh] = adaptive_windows(cx, x.dims[rank - 2], out[rank - 2], t);
  const auto [mw, lw] = adaptive_windows(cx, x.dims[rank - 1], out[rank - 1], t);
  const int64_t h = static_cast<int64_t>(rank) - 2, w = static_cast<int64_t>(rank) - 1;
  const Operand by_cols = cx.dot(x, mw, {}, w, 1, t);                          // [..., H, Wo]
  const Operand sums = swap_last_two(cx, cx.dot(by_cols, mh, {}, h, 1, t));  // [..., Ho, Wo]
  cx.set(n, 0, cx.as(cx.binary("stablehlo.divide", sums, adaptive_counts(cx, lh, lw, out, t), t), out_t));
}

// (grad, self): each input element gets grad / window size of every window that holds it: the
// products with the window matrices transposed.
void adaptive_avg_pool2d_backward(LoweringContext& cx, const Node* n) {
  const c10::ScalarType out_t = cx.out_dtype(n), t = accumulation_type(out_t);
  const Dims in = cx.out_dims(n);
  check_rank(in);
  const Operand grad = cx.as(cx.in(n, 0), t);
  const size_t rank = in.size();
  const auto [mh, lh] = adaptive_windows(cx, in[rank - 2], grad.dims[rank - 2], t);
  const auto [mw, lw] = adaptive_windows(cx, in[rank - 1], grad.dims[rank - 1], t);
  const int64_t h = static_cast<int64_t>(rank) - 2, w = static_cast<int64_t>(rank) - 1;
  const Operand g = cx.binary("stablehlo.divide", grad, adaptive_counts(cx, lh, lw, grad.dims, t), t);
  const Operand by_cols = cx.dot(g, mw, {}, w, 0, t);                         // [..., Ho, W]
  const Operand full = swap_last_two(cx, cx.dot(by_cols, mh, {}, h, 0, t));  // [..., H, W]
  cx.set(n, 0, cx.as(full, out_t));
}

}  // namespace

void add_pool_rules(RuleTable& table) {
  table.add("aten::avg_pool2d", avg_pool2d);
  table.add("aten::avg_pool2d_backward", avg_pool2d_backward);
  table.add("aten::_adaptive_avg_pool2d", adaptive_avg_pool2d);
  table.add("aten::_adaptive_avg_pool2d_backward", adaptive_avg_pool2d_backward);
}

}  // namespace fulgur::xla::stablehlo
