// SPDX-License-Identifier: Apache-2.0
// Pooling rules over the last two dims of a [N, C, H, W] or [C, H, W] input: max_pool2d with
// indices (generic, and the packed float32 form of platform xla_cpu) and its backward,
// threshold_backward (ReLU's backward), and avg_pool2d and _adaptive_avg_pool2d with their
// backwards (sums in float32 for 16-bit floats, each result rounded once). Upsampling is in
// upsample.cpp.

#include "xla/stablehlo/lowering.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

namespace fulgur::xla::stablehlo {
namespace {

// Each element's flat index h * W + w in its plane (the last two dims of `dims`), as a pool's
// indices count.
Operand plane_index(LoweringContext& cx, const Dims& dims) {
  const size_t rank = dims.size();
  auto iota = [&](size_t dim) {
    return cx.op("stablehlo.iota", {}, dims, c10::kLong, "iota_dimension = " + std::to_string(dim) + " : i64");
  };
  const Operand rows = iota(rank - 2), cols = iota(rank - 1);
  return cx.add(cx.mul(rows, number(dims[rank - 1])), cols);
}

// The reduce_window attributes of a max_pool2d_with_indices node (padding, window_dimensions,
// window_strides over all dims) and its output's dims.
struct MaxPoolWindow {
  std::string attrs;
  Dims dims;
};

MaxPoolWindow max_pool_window(const LoweringContext& cx, const Node* n) {
  const size_t rank = cx.in(n, 0).dims.size();
  if (rank != 3 && rank != 4) throw Unsupported{"input of " + std::to_string(rank) + " dimensions"};
  const Dims kernel = cx.spatial_arg(n, 1, "kernel_size", 2, {});
  const Dims stride = cx.spatial_arg(n, 2, "stride", 2, kernel), padding = cx.spatial_arg(n, 3, "padding", 2, {0}),
             dilation = cx.spatial_arg(n, 4, "dilation", 2, {1});
  if (dilation != Dims{1, 1}) throw Unsupported{"dilation " + ints(dilation)};
  if (cx.bool_arg(n, 5, "ceil_mode")) throw Unsupported{"ceil_mode"};
  Dims window(rank, 1), strides(rank, 1);
  std::string pad = "dense<[";
  for (size_t i = 0; i < rank; ++i) {
    const int64_t p = i + 2 >= rank ? padding[i + 2 - rank] : 0;
    if (i + 2 >= rank) {
      window[i] = kernel[i + 2 - rank];
      strides[i] = stride[i + 2 - rank];
    }
    pad += (i ? ", [" : "[") + std::to_string(p) + ", " + std::to_string(p) + "]";
  }
  pad += "]> : tensor<" + std::to_string(rank) + "x2xi64>";
  return {"padding = " + pad + ", window_dimensions = " + i64_array(window) + ", window_strides = " + i64_array(strides),
          cx.out_dims(n, 0)};
}

// Platform xla_cpu: a float32 max_pool2d_with_indices as one reduce_window over each value and
// its plane index packed into an int64.
bool packed_max_pool(LoweringContext& cx, const Node* n) {
  const c10::ScalarType t = cx.out_dtype(n, 0);
  if (t != c10::kFloat) return false;
  const MaxPoolWindow pool = max_pool_window(cx, n);
  const Dims& dims = pool.dims;
  const Operand x = cx.as(cx.in(n, 0), t);
  // Each value and its plane index packed into one int64 whose order is the window's choice:
  // the float's bits made an order-preserving int32 (negative values' low 31 bits flipped) in
  // the high half, 0xFFFFFFFF - index in the low half, so that a tie goes to the smaller index.
  // One reduce_window (max) of one result picks both; XLA:CPU splits it over its threads, where
  // the generic rule's variadic one runs on one (a tuple-shaped op gets no partitions): the
  // MNIST CNN's step 0.86x (bench/history/libtorch-1.13.md). libtorch takes a NaN over any number and
  // the last of several NaNs (`val > max || isnan(val)`): every NaN becomes one positive NaN,
  // above +inf, and carries its index itself in the low half, so that the larger one wins.
  const int64_t low_bits = 0xFFFFFFFF, nan_bits = 0x7FC00000;
  // The order-preserving map of int32 float bits (held in int64), its own inverse.
  auto flip_negative = [&](const Operand& bits) {
    return cx.select(cx.compare("LT", bits, number(0), c10::kLong),
                     cx.binary("stablehlo.xor", bits, number(0x7FFFFFFF), c10::kLong), bits);
  };
  const Operand zero = cx.splat(0, x.dims, t);
  const Operand is_nan = cx.compare("NE", x, x, t);
  const Operand unsigned_zero = cx.select(cx.compare("EQ", x, zero, t), zero, x);  // -0.0 ties +0.0, as in libtorch
  const Operand bits = cx.op("stablehlo.bitcast_convert", {unsigned_zero}, x.dims, c10::kInt);
  const Operand key =
      cx.select(is_nan, cx.splat(nan_bits, x.dims, c10::kLong), flip_negative(cx.as(bits, c10::kLong)));
  const Operand index = plane_index(cx, x.dims);
  const Operand low_half =
      cx.select(is_nan, index, cx.binary("stablehlo.subtract", number(low_bits), index, c10::kLong));
  const Operand packed = cx.add(cx.binary("stablehlo.shift_left", key, number(32), c10::kLong), low_half);
  const Operand lowest = cx.splat(std::numeric_limits<int64_t>::min(), {}, c10::kLong);
  const Operand best = cx.op("stablehlo.reduce_window", {packed, lowest}, dims, c10::kLong, pool.attrs,
                             cx.combiner("stablehlo.maximum", c10::kLong));
  const Operand best_key = cx.binary("stablehlo.shift_right_arithmetic", best, number(32), c10::kLong);
  const Operand low = cx.binary("stablehlo.and", best, number(low_bits), c10::kLong);
  cx.set(n, 0, cx.op("stablehlo.bitcast_convert", {cx.as(flip_negative(best_key), c10::kInt)}, dims, t));
  cx.set(n, 1, cx.select(cx.compare("EQ", best_key, number(nan_bits), c10::kLong), low,
                         cx.binary("stablehlo.subtract", number(low_bits), low, c10::kLong)));
  return true;
}

// (self [N, C, H, W] or [C, H, W], kernel_size, stride, padding, dilation, ceil_mode) ->
// (output, indices): each window's maximum and the flat index (h * W + w) of its first maximum,
// as libtorch's CPU kernel: a variadic reduce_window over the values and their indices. A tie
// goes to the smaller index, which is the first in the window; the initial index is the largest
// int64, so a window of -inf alone names its first element, as libtorch does. A NaN wins over
// any number and the last of several NaNs is the index, as libtorch's `val > max || isnan(val)`.
// (A variadic reduce over the window dims of a tiled plane was tried for 2x2 pools: XLA:CPU runs
// a reduce fusion on one thread, so the CNN step got slower.)
void max_pool2d_with_indices(LoweringContext& cx, const Node* n) {
  const c10::ScalarType t = cx.out_dtype(n, 0);
  const MaxPoolWindow pool = max_pool_window(cx, n);
  const Operand x = cx.as(cx.in(n, 0), t);
  // (a, ai) or (b, bi): a NaN over a number, of two NaNs the larger index (libtorch's last), of
  // two numbers the larger, of equal ones the smaller index.
  const std::string v = mlir_type({}, t), l = mlir_type({}, c10::kLong);
  const std::string a = cx.fresh(), ai = cx.fresh(), b = cx.fresh(), bi = cx.fresh(), gt = cx.fresh(),
                    eq = cx.fresh(), lt = cx.fresh(), later = cx.fresh(), a_nan = cx.fresh(), b_nan = cx.fresh(),
                    b_num = cx.fresh(), tie = cx.fresh(), larger = cx.fresh(), by_value = cx.fresh(),
                    nan_wins = cx.fresh(), nan_pick = cx.fresh(), pick = cx.fresh(), rv = cx.fresh(), ri = cx.fresh();
  auto cmp = [&](const std::string& r, const std::string& x0, const std::string& x1, const std::string& ty,
                 const char* dir) {
    return "      " + r + " = \"stablehlo.compare\"(" + x0 + ", " + x1 +
           ") {comparison_direction = #stablehlo<comparison_direction " + dir + ">} : (" + ty + ", " + ty +
           ") -> tensor<i1>\n";
  };
  auto logic = [&](const std::string& r, const char* what, const std::string& x0, const std::string& x1) {
    return "      " + r + " = \"stablehlo." + what + "\"(" + x0 + ", " + x1 +
           ") : (tensor<i1>, tensor<i1>) -> tensor<i1>\n";
  };
  const std::string region =
      "{\n    ^bb0(" + a + ": " + v + ", " + ai + ": " + l + ", " + b + ": " + v + ", " + bi + ": " + l + "):\n" +
      cmp(gt, a, b, v, "GT") + cmp(eq, a, b, v, "EQ") + cmp(lt, ai, bi, l, "LT") + cmp(later, ai, bi, l, "GT") +
      cmp(a_nan, a, a, v, "NE") + cmp(b_nan, b, b, v, "NE") + "      " + b_num + " = \"stablehlo.not\"(" + b_nan +
      ") : (tensor<i1>) -> tensor<i1>\n" + logic(tie, "and", eq, lt) + logic(larger, "or", gt, tie) +
      logic(by_value, "and", b_num, larger) + logic(nan_wins, "or", b_num, later) +
      logic(nan_pick, "and", a_nan, nan_wins) + logic(pick, "or", nan_pick, by_value) + "      " + rv +
      " = \"stablehlo.select\"(" + pick + ", " + a + ", " + b + ") : (tensor<i1>, " + v + ", " + v + ") -> " + v +
      "\n      " + ri + " = \"stablehlo.select\"(" + pick + ", " + ai + ", " + bi + ") : (tensor<i1>, " + l + ", " + l +
      ") -> " + l + "\n      \"stablehlo.return\"(" + rv + ", " + ri + ") : (" + v + ", " + l + ") -> ()\n    }";
  const std::vector<Operand> outs =
      cx.op_n("stablehlo.reduce_window",
           {x, plane_index(cx, x.dims), cx.splat(-std::numeric_limits<double>::infinity(), {}, t),
            cx.splat(std::numeric_limits<int64_t>::max(), {}, c10::kLong)},
           {{pool.dims, t}, {pool.dims, c10::kLong}}, pool.attrs, region);
  cx.set(n, 0, outs[0]);
  cx.set(n, 1, outs[1]);
}

// (grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices) -> grad_input:
// each grad_output element added at the position the forward's indices name in its plane. When
// the windows do not overlap (stride == kernel, no dilation: the usual 2x2 pooling) a position
// lies in at most one window, so its gradient is that window's where the window's index names
// it and 0 elsewhere: an elementwise select over grad_output and indices upsampled to the
// input's shape, which XLA fuses with what follows. Otherwise a scatter-add over the flattened
// input (XLA:CPU runs a scatter as one sequential loop: 10x eager on the CNN's pools).
bool windows_tile(LoweringContext& cx, const Node* n) {
  const Dims kernel = cx.spatial_arg(n, 2, "kernel_size", 2, {});
  return cx.spatial_arg(n, 3, "stride", 2, kernel) == kernel && cx.spatial_arg(n, 5, "dilation", 2, {1}) == Dims{1, 1};
}

// A max pool's backward whose windows do not overlap (stride = kernel, no dilation): `grad` (at
// the pool's output size) upsampled to each window's maximum, zero elsewhere; nullopt for other
// pools. `n` is the aten::max_pool2d_with_indices_backward node.
std::optional<Operand> tiled_pool_backward(LoweringContext& cx, const Node* n, const Operand& grad) {
  const Dims dims = cx.out_dims(n);
  const size_t rank = dims.size();
  if (rank != 3 && rank != 4) throw Unsupported{"input of " + std::to_string(rank) + " dimensions"};
  if (!windows_tile(cx, n)) return std::nullopt;
  const Dims kernel = cx.spatial_arg(n, 2, "kernel_size", 2, {});
  const Dims padding = cx.spatial_arg(n, 4, "padding", 2, {0});
  const Operand indices = cx.as(cx.in(n, 7), c10::kLong);
  const size_t lead = rank - 2;
  Dims big(grad.dims.begin(), grad.dims.begin() + lead), map, joined(big), low(rank, 0), high(rank, 0);
  for (size_t i = 0; i < lead; ++i) map.push_back(static_cast<int64_t>(i));
  for (size_t i = 0; i < 2; ++i) {
    map.push_back(static_cast<int64_t>(big.size()));
    big.push_back(grad.dims[lead + i]);
    big.push_back(kernel[i]);
    joined.push_back(grad.dims[lead + i] * kernel[i]);
    // The windows start at -padding: the upsampled plane, moved into the input's coordinates.
    low[lead + i] = -padding[i];
    high[lead + i] = dims[lead + i] + padding[i] - joined.back();
  }
  auto upsampled = [&](const Operand& v, const c10::Scalar& fill) {
    const Operand b = cx.op("stablehlo.broadcast_in_dim", {v}, big, v.dtype, "broadcast_dimensions = " + i64_array(map));
    const Operand r = cx.reshape(b, joined);
    if (r.dims == dims) return r;
    return cx.op("stablehlo.pad", {r, cx.splat(fill, {}, v.dtype)}, dims, v.dtype,
              "edge_padding_high = " + i64_array(high) + ", edge_padding_low = " + i64_array(low) +
                  ", interior_padding = " + i64_array(Dims(rank, 0)));
  };
  return cx.select(cx.compare("EQ", upsampled(indices, -1), plane_index(cx, dims), c10::kLong), upsampled(grad, 0),
                cx.splat(0, {}, grad.dtype));
}

void max_pool2d_with_indices_backward(LoweringContext& cx, const Node* n) {
  const c10::ScalarType t = cx.out_dtype(n);
  const Operand grad = cx.as(cx.in(n, 0), t);
  if (std::optional<Operand> tiled = tiled_pool_backward(cx, n, grad)) {
    cx.set(n, 0, std::move(*tiled));
    return;
  }
  const Dims dims = cx.out_dims(n);
  const size_t rank = dims.size();
  const Dims padding = cx.spatial_arg(n, 4, "padding", 2, {0});
  const Operand indices = cx.as(cx.in(n, 7), c10::kLong);
  const int64_t plane = dims[rank - 1] * dims[rank - 2];
  int64_t total = 1, k = 1;
  for (int64_t d : dims) total *= d;
  for (int64_t d : grad.dims) k *= d;
  // The plane of each grad_output element: its flat index over the leading dims.
  Operand plane_index = cx.splat(0, grad.dims, c10::kLong);
  for (size_t i = 0; i + 2 < rank; ++i) {
    int64_t stride = 1;
    for (size_t j = i + 1; j + 2 < rank; ++j) stride *= grad.dims[j];
    const Operand iota =
        cx.op("stablehlo.iota", {}, grad.dims, c10::kLong, "iota_dimension = " + std::to_string(i) + " : i64");
    plane_index = cx.add(plane_index, cx.mul(iota, number(stride)));
  }
  const Operand where = cx.reshape(cx.add(cx.mul(plane_index, number(plane)), indices), {k});
  const std::string numbers =
      "scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], "
      "index_vector_dim = 1>, indices_are_sorted = false, unique_indices = false";
  const Operand flat = cx.op("stablehlo.scatter", {cx.splat(0, {total}, t), where, cx.reshape(grad, {k})}, {total}, t, numbers,
                          cx.combiner("stablehlo.add", t));
  cx.set(n, 0, cx.reshape(flat, dims));
}

// (grad, self, threshold) -> self <= threshold ? 0 : grad (ReLU's backward). Before a tiled max
// pool's backward, the graph pass move_thresholds_before_tiled_pools (passes.h) has made it a
// threshold of grad against the pooled maxima, at the pool's output size.
void threshold_backward(LoweringContext& cx, const Node* n) {
  const c10::ScalarType t = cx.out_dtype(n);
  const Operand& self = cx.in(n, 1);
  const Operand below = cx.compare("LE", self, cx.in(n, 2), self.dtype);
  cx.set(n, 0, cx.select(below, cx.splat(0, {}, t), cx.as(cx.in(n, 0), t)));
}

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
  table.add("aten::max_pool2d_with_indices", max_pool2d_with_indices, "StableHlo.MaxPoolWithIndicesAndItsBackward");
  table.add_platform("aten::max_pool2d_with_indices", Platform::xla_cpu, packed_max_pool);
  table.add("aten::max_pool2d_with_indices_backward", max_pool2d_with_indices_backward,
            "StableHlo.MaxPoolWithIndicesAndItsBackward");
  table.add("aten::threshold_backward", threshold_backward,
            "StableHlo.AThresholdBeforeATiledMaxPoolIsAppliedAtThePoolsSize");
  table.add("aten::avg_pool2d", avg_pool2d, "XlaOps.AveragePoolsAndTheirBackwards");
  table.add("aten::avg_pool2d_backward", avg_pool2d_backward, "XlaOps.AveragePoolsAndTheirBackwards");
  table.add("aten::_adaptive_avg_pool2d", adaptive_avg_pool2d, "XlaOps.AveragePoolsAndTheirBackwards");
  table.add("aten::_adaptive_avg_pool2d_backward", adaptive_avg_pool2d_backward,
            "XlaOps.AveragePoolsAndTheirBackwards");
}

}  // namespace fulgur::xla::stablehlo
