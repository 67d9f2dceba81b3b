// The StableHLO emitter; see emitter.h. The driver (Emitter::run) walks the graph and calls each
// live node's lowering rule: the rule table of the op families in rules/ (lowering.h), then the
// rules still written here as members of Emitter (lowerings()), which move to family files one
// family at a time.

#include "xla/stablehlo/emitter.h"

#include "xla/host_kernels.h"
#include "xla/stablehlo/lowering.h"

#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/ir/ir.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

namespace fulgur::xla::stablehlo {
namespace {

class Emitter : public LoweringContext {
 public:
  Emitter(const torch::jit::Graph& graph, const EmitOptions& options, const std::vector<Alias>& aliases)
      : LoweringContext(graph, options), aliases_(aliases) {}

  Emission run();

 private:
  using Lowering = std::function<void(Emitter&, const Node*)>;
  static const std::unordered_map<std::string, Lowering>& lowerings();

  Operand operand_of_input(const Value* v);

  void convolution(const Node* n);
  void convolution_backward(const Node* n);
  void max_pool2d_with_indices(const Node* n);
  void max_pool2d_with_indices_backward(const Node* n);
  // A max pool's backward whose windows do not overlap (stride = kernel, no dilation): `grad` (at
  // the pool's output size) upsampled to each window's maximum, zero elsewhere; nullopt for other
  // pools. `n` is the aten::max_pool2d_with_indices_backward node.
  std::optional<Operand> tiled_pool_backward(const Node* n, const Operand& grad);
  // Whether the windows of the aten::max_pool2d_with_indices_backward node `n` do not overlap.
  static bool windows_tile(const Node* n);
  // threshold_backward(max_pool2d_with_indices_backward(g, x, ..., indices), x, threshold) of a
  // tiled pool, with `indices` the pool of x's: the threshold applied to g against the pooled
  // maxima, then the pool's backward; nullopt when `n` is not that. See its definition.
  std::optional<Operand> threshold_before_pool_backward(const Node* n);
  // Each element's flat index h * W + w in its plane (the last two dims of `dims`), as a pool's
  // indices count.
  Operand plane_index(const Dims& dims);
  // A stablehlo.convolution; `layout` is its dimension_numbers, spatial dims 0..rank-3.
  Operand conv(const Operand& lhs, const Operand& rhs, const std::string& layout, const Dims& dims,
               const Dims& strides, const std::vector<std::pair<int64_t, int64_t>>& padding, const Dims& lhs_dilation,
               const Dims& rhs_dilation, int64_t feature_groups);
  // A convolution of one input feature (groups 1, float32 or float64, at most
  // kMaxShiftedSumTaps kernel taps), as the sum over the taps of a shifted window of the padded
  // input times that tap's weights; see convolution().
  Operand conv_as_shifted_sum(const Operand& x, const Operand& w, const Dims& dims, const Dims& stride,
                              const Dims& padding, const Dims& dilation);
  // The window arguments of a convolution or a pooling, one per spatial dim (a single value
  // repeated); checks the node's other arguments are those the lowerings handle.
  static Dims spatial_arg(const Node* n, size_t i, const char* what, size_t spatial, const Dims& if_empty);

  // A stablehlo.custom_call of host kernel `target` (xla/host_kernels.h) with the window of a
  // convolution node as its attributes, plus `extra` ("name = value, ").
  std::vector<Operand> host_call(const char* target, const std::vector<Operand>& args,
                                 const std::vector<std::pair<Dims, c10::ScalarType>>& results, const Dims& stride,
                                 const Dims& padding, const Dims& dilation, int64_t groups, const std::string& extra);
  bool host_convolution(c10::ScalarType t) const {
    return options_.host_convolutions && (t == c10::kFloat || t == c10::kDouble);
  }

  const std::vector<Alias> aliases_;  // asked for by the caller
};

Operand Emitter::operand_of_input(const Value* v) {
  const c10::TypePtr& type = v->type();
  if (const auto tensor = type->cast<c10::TensorType>()) {
    const auto sizes = tensor->sizes().concrete_sizes();
    if (!sizes || !tensor->scalarType())
      throw std::invalid_argument("graph input %" + v->debugName() + " has type " + type->repr_str() +
                                  ": the emitter needs concrete sizes and a scalar type");
    return {"", *sizes, *tensor->scalarType(), sizes->empty() ? Tier::zero_dim : Tier::dimensioned, std::nullopt};
  }
  switch (type->kind()) {
    case c10::TypeKind::IntType: return {"", {}, c10::kLong, Tier::number, std::nullopt};
    case c10::TypeKind::FloatType: return {"", {}, c10::kDouble, Tier::number, std::nullopt};
    case c10::TypeKind::BoolType: return {"", {}, c10::kBool, Tier::number, std::nullopt};
    default:
      throw Unsupported{"graph input %" + v->debugName() + " of type " + type->repr_str() +
                        " (the emitter takes tensors, ints, floats and bools)"};
  }
}

// ---------------------------------------------------------------------------------------------

Dims Emitter::spatial_arg(const Node* n, size_t i, const char* what, size_t spatial, const Dims& if_empty) {
  Dims v = ints_arg(n, i, what);
  if (v.empty()) v = if_empty;
  if (v.size() == 1) v.assign(spatial, v[0]);
  if (v.size() != spatial) throw std::invalid_argument(std::string(what) + " of another length than the spatial dims");
  return v;
}

Operand Emitter::conv(const Operand& lhs, const Operand& rhs, const std::string& layout, const Dims& dims,
                      const Dims& strides, const std::vector<std::pair<int64_t, int64_t>>& padding,
                      const Dims& lhs_dilation, const Dims& rhs_dilation, int64_t feature_groups) {
  std::string pad = "dense<[";
  for (size_t i = 0; i < padding.size(); ++i)
    pad += (i ? ", [" : "[") + std::to_string(padding[i].first) + ", " + std::to_string(padding[i].second) + "]";
  pad += "]> : tensor<" + std::to_string(padding.size()) + "x2xi64>";
  return op("stablehlo.convolution", {lhs, rhs}, dims, lhs.dtype,
            "batch_group_count = 1 : i64, dimension_numbers = #stablehlo.conv<" + layout +
                ">, feature_group_count = " + std::to_string(feature_groups) + " : i64, lhs_dilation = " +
                i64_array(lhs_dilation) + ", padding = " + pad + ", rhs_dilation = " + i64_array(rhs_dilation) +
                ", window_strides = " + i64_array(strides));
}

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

// out[b, o, p] = sum over taps k of x_padded[b, 0, p * stride + k * dilation] * w[o, 0, k]: each
// tap a strided slice of the padded input broadcast over the output features, times the tap's
// column of weights broadcast over batch and space, the products added in tap order. XLA fuses
// the whole sum (and the bias and activation after it) into one elementwise loop.
Operand Emitter::conv_as_shifted_sum(const Operand& x, const Operand& w, const Dims& dims, const Dims& stride,
                                     const Dims& padding, const Dims& dilation) {
  const size_t spatial = x.dims.size() - 2;
  const int64_t rank = static_cast<int64_t>(x.dims.size());
  Dims low = {0, 0}, interior(x.dims.size(), 0), padded = x.dims;
  for (size_t i = 0; i < spatial; ++i) {
    low.push_back(padding[i]);
    padded[i + 2] += 2 * padding[i];
  }
  const Operand xp = op("stablehlo.pad", {x, splat(0, {}, x.dtype)}, padded, x.dtype,
                        "edge_padding_high = " + i64_array(low) + ", edge_padding_low = " + i64_array(low) +
                            ", interior_padding = " + i64_array(interior));
  int64_t taps = 1;
  for (size_t i = 0; i < spatial; ++i) taps *= w.dims[i + 2];
  const int64_t features = w.dims[0];
  const Operand columns = reshape(w, {features, taps});
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
    const Operand shifted = op("stablehlo.slice", {xp}, window, x.dtype,
                               "limit_indices = " + i64_array(limit) + ", start_indices = " + i64_array(start) +
                                   ", strides = " + i64_array(steps));
    const Operand tap = op("stablehlo.slice", {columns}, {features, 1}, x.dtype,
                           "limit_indices = " + i64_array({features, k + 1}) + ", start_indices = " +
                               i64_array({0, k}) + ", strides = " + i64_array({1, 1}));
    const Operand product =
        mul(op("stablehlo.broadcast_in_dim", {shifted}, dims, x.dtype, "broadcast_dimensions = " + i64_array(all)),
            op("stablehlo.broadcast_in_dim", {tap}, dims, x.dtype, "broadcast_dimensions = array<i64: 1, 0>"));
    sum = k == 0 ? product : add(sum, product);
  }
  return sum;
}

// (input, weight, bias?, stride, padding, dilation, transposed, output_padding, groups)
//
// A convolution of one input feature (the MNIST CNN's first) is written as a shifted sum
// (conv_as_shifted_sum) when it has groups 1, at most kMaxShiftedSumTaps taps and a float32 or
// float64 result: XLA:CPU runs a stablehlo.convolution as Eigen's spatial convolution, whose
// contraction over 1 x 5 x 5 values per output is 4-5x slower than the shifted sum's one fused
// loop on the CNN's conv1 (bench/history/libtorch-1.13.md, `xla_op_bench`). Other convolutions are one
// stablehlo.convolution in PyTorch's NCHW / OIHW layout (XLA's layout assignment moves the
// features minor for Eigen by itself).
void Emitter::convolution(const Node* n) {
  const c10::ScalarType t = out_dtype(n);
  const Operand x = as(in(n, 0), t), w = as(in(n, 1), t);
  const size_t spatial = x.dims.size() - 2;
  if (bool_arg(n, 6, "transposed")) throw Unsupported{"transposed"};
  const Dims stride = spatial_arg(n, 3, "stride", spatial, {1}), padding = spatial_arg(n, 4, "padding", spatial, {0}),
             dilation = spatial_arg(n, 5, "dilation", spatial, {1});
  const int64_t groups = int_arg(n, 8, "groups");
  if (host_convolution(t)) {
    std::vector<Operand> args{x, w};
    if (!none_arg(n, 2)) args.push_back(as(in(n, 2), t));
    set(n, 0, host_call(host_kernels::kConvolution, args, {{out_dims(n), t}}, stride, padding, dilation, groups, "")[0]);
    return;
  }
  int64_t taps = 1;
  for (size_t i = 0; i < spatial; ++i) taps *= w.dims[i + 2];
  Operand out;
  if (x.dims[1] == 1 && groups == 1 && taps <= kMaxShiftedSumTaps && (t == c10::kFloat || t == c10::kDouble)) {
    out = conv_as_shifted_sum(x, w, out_dims(n), stride, padding, dilation);
  } else {
    std::vector<std::pair<int64_t, int64_t>> pads;
    for (int64_t p : padding) pads.emplace_back(p, p);
    const std::string layout = conv_layout("b", "f", spatial) + "x" + conv_layout("o", "i", spatial) + "->" +
                               conv_layout("b", "f", spatial);
    out = conv(x, w, layout, out_dims(n), stride, pads, Dims(spatial, 1), dilation, groups);
  }
  if (!none_arg(n, 2))
    out = add(out, op("stablehlo.broadcast_in_dim", {as(in(n, 2), t)}, out.dims, t, "broadcast_dimensions = array<i64: 1>"));
  set(n, 0, out);
}

// (grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed, output_padding,
// groups, output_mask) -> (grad_input, grad_weight, grad_bias), as JAX differentiates a
// convolution: grad_input is grad_output dilated by the stride, convolved with the kernel
// reversed in space and its feature dims swapped; grad_weight convolves the input with
// grad_output over the batch (batch and features exchanged); grad_bias sums grad_output over all
// but its features. Outputs the mask leaves undefined must be unused.
void Emitter::convolution_backward(const Node* n) {
  const c10::ScalarType t = out_dtype(n, 1);
  const Operand grad = as(in(n, 0), t), x = as(in(n, 1), t), w = as(in(n, 2), t);
  const size_t spatial = x.dims.size() - 2;
  if (bool_arg(n, 7, "transposed")) throw Unsupported{"transposed"};
  if (int_arg(n, 9, "groups") != 1) throw Unsupported{"groups " + std::to_string(int_arg(n, 9, "groups"))};
  const Dims stride = spatial_arg(n, 4, "stride", spatial, {1}), padding = spatial_arg(n, 5, "padding", spatial, {0}),
             dilation = spatial_arg(n, 6, "dilation", spatial, {1});
  const std::vector<bool> mask = constant(n, 10, "output_mask").toBoolList().vec();
  for (size_t i = 0; i < 3; ++i)
    if (!mask.at(i) && used(n->output(i))) throw Unsupported{"a use of undefined output " + std::to_string(i)};
  if (host_convolution(t)) {
    std::vector<std::pair<Dims, c10::ScalarType>> results;
    for (size_t i = 0; i < 3; ++i)
      if (mask[i]) results.emplace_back(out_dims(n, i), t);
    const Dims flags{int64_t{mask[0]}, int64_t{mask[1]}, int64_t{mask[2]}};
    const auto outs = host_call(host_kernels::kConvolutionBackward, {grad, x, w}, results, stride, padding, dilation,
                                1, "output_mask = " + i64_array(flags) + ", ");
    for (size_t i = 0, j = 0; i < 3; ++i)
      if (mask[i]) set(n, i, outs[j++]);
    return;
  }
  Dims spatial_dims;
  for (size_t i = 0; i < spatial; ++i) spatial_dims.push_back(static_cast<int64_t>(i + 2));
  if (mask[0]) {
    std::vector<std::pair<int64_t, int64_t>> pads;
    for (size_t i = 0; i < spatial; ++i) {
      const int64_t extent = dilation[i] * (w.dims[i + 2] - 1);
      const int64_t lo = extent - padding[i];
      const int64_t hi = x.dims[i + 2] - 1 - (grad.dims[i + 2] - 1) * stride[i] - lo + extent;
      pads.emplace_back(lo, hi);
    }
    const Operand flipped = op("stablehlo.reverse", {w}, w.dims, t, "dimensions = " + i64_array(spatial_dims));
    const std::string layout = conv_layout("b", "f", spatial) + "x" + conv_layout("i", "o", spatial) + "->" +
                               conv_layout("b", "f", spatial);
    set(n, 0, conv(grad, flipped, layout, x.dims, Dims(spatial, 1), pads, stride, dilation, 1));
  }
  if (mask[1]) {
    std::vector<std::pair<int64_t, int64_t>> pads;
    for (size_t i = 0; i < spatial; ++i) {
      const int64_t hi = (w.dims[i + 2] - 1) * dilation[i] + (grad.dims[i + 2] - 1) * stride[i] + 1 - x.dims[i + 2] -
                         padding[i];
      pads.emplace_back(padding[i], hi);
    }
    const std::string layout = conv_layout("f", "b", spatial) + "x" + conv_layout("i", "o", spatial) + "->" +
                               conv_layout("f", "b", spatial);
    set(n, 1, conv(x, grad, layout, w.dims, dilation, pads, Dims(spatial, 1), stride, 1));
  }
  if (mask[2]) {
    Dims dims = {0};
    for (int64_t d : spatial_dims) dims.push_back(d);
    // Summed in float32 for 16-bit floats, as at::sum.
    const Operand sum = reduce(as(grad, accumulation_type(t)), dims, "stablehlo.add", 0);
    set(n, 2, reshape(as(sum, out_dtype(n, 2)), out_dims(n, 2)));
  }
}

std::vector<Operand> Emitter::host_call(const char* target, const std::vector<Operand>& args,
                                        const std::vector<std::pair<Dims, c10::ScalarType>>& results,
                                        const Dims& stride, const Dims& padding, const Dims& dilation, int64_t groups,
                                        const std::string& extra) {
  const std::string attrs = std::string("call_target_name = \"") + target +
                            "\", api_version = 4 : i32, backend_config = {" + extra +
                            "stride = " + i64_array(stride) + ", padding = " + i64_array(padding) +
                            ", dilation = " + i64_array(dilation) + ", groups = " + std::to_string(groups) + " : i64}";
  if (results.size() == 1) return {op("stablehlo.custom_call", args, results[0].first, results[0].second, attrs)};
  return op_n("stablehlo.custom_call", args, results, attrs, "");
}

Operand Emitter::plane_index(const Dims& dims) {
  const size_t rank = dims.size();
  const Operand rows = op("stablehlo.iota", {}, dims, c10::kLong, "iota_dimension = " + std::to_string(rank - 2) + " : i64");
  const Operand cols = op("stablehlo.iota", {}, dims, c10::kLong, "iota_dimension = " + std::to_string(rank - 1) + " : i64");
  return add(mul(rows, number(dims[rank - 1])), cols);
}

// (self [N, C, H, W] or [C, H, W], kernel_size, stride, padding, dilation, ceil_mode) ->
// (output, indices): each window's maximum and the flat index (h * W + w) of its first maximum,
// as libtorch's CPU kernel. Float32: a reduce_window over value and index packed into an int64
// (below). Other types: a variadic reduce_window over the values and their indices. A tie
// goes to the smaller index, which is the first in the window; the initial index is the largest
// int64, so a window of -inf alone names its first element, as libtorch does. A NaN wins over
// any number and the last of several NaNs is the index, as libtorch's `val > max || isnan(val)`.
// (A variadic reduce over the window dims of a tiled plane was tried for 2x2 pools: XLA:CPU runs
// a reduce fusion on one thread, 1.03x slower on the CNN step.)
void Emitter::max_pool2d_with_indices(const Node* n) {
  const c10::ScalarType t = out_dtype(n, 0);
  const Operand x = as(in(n, 0), t);
  const size_t rank = x.dims.size();
  if (rank != 3 && rank != 4) throw Unsupported{"input of " + std::to_string(rank) + " dimensions"};
  const Dims kernel = spatial_arg(n, 1, "kernel_size", 2, {});
  const Dims stride = spatial_arg(n, 2, "stride", 2, kernel), padding = spatial_arg(n, 3, "padding", 2, {0}),
             dilation = spatial_arg(n, 4, "dilation", 2, {1});
  if (dilation != Dims{1, 1}) throw Unsupported{"dilation " + ints(dilation)};
  if (bool_arg(n, 5, "ceil_mode")) throw Unsupported{"ceil_mode"};
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
  const Dims dims = out_dims(n, 0);
  const std::string window_attrs =
      "padding = " + pad + ", window_dimensions = " + i64_array(window) + ", window_strides = " + i64_array(strides);
  if (t == c10::kFloat) {
    // Each value and its plane index packed into one int64 whose order is the window's choice:
    // the float's bits made an order-preserving int32 (negative values' low 31 bits flipped) in
    // the high half, 0xFFFFFFFF - index in the low half, so that a tie goes to the smaller index.
    // One reduce_window (max) of one result picks both; XLA:CPU splits it over its threads,
    // where the variadic one below runs on one (a tuple-shaped op gets no partitions): the MNIST
    // CNN's step 0.86x (bench/history/libtorch-1.13.md). libtorch takes a NaN over any number and
    // the last of several NaNs (`val > max || isnan(val)`): every NaN becomes one positive NaN,
    // above +inf, and carries its index itself in the low half, so that the larger one wins.
    const int64_t low_bits = 0xFFFFFFFF, nan_bits = 0x7FC00000;
    // The order-preserving map of int32 float bits (held in int64), its own inverse.
    auto flip_negative = [&](const Operand& bits) {
      return select(compare("LT", bits, number(0), c10::kLong), binary("stablehlo.xor", bits, number(0x7FFFFFFF), c10::kLong),
                    bits);
    };
    const Operand zero = splat(0, x.dims, t);
    const Operand is_nan = compare("NE", x, x, t);
    const Operand bits = op("stablehlo.bitcast_convert", {select(compare("EQ", x, zero, t), zero, x)}, x.dims,
                            c10::kInt);  // -0.0 ties +0.0, as in libtorch
    const Operand key = select(is_nan, splat(nan_bits, x.dims, c10::kLong), flip_negative(as(bits, c10::kLong)));
    const Operand index = plane_index(x.dims);
    const Operand packed = add(binary("stablehlo.shift_left", key, number(32), c10::kLong),
                               select(is_nan, index, binary("stablehlo.subtract", number(low_bits), index, c10::kLong)));
    const Operand best = op("stablehlo.reduce_window", {packed, splat(std::numeric_limits<int64_t>::min(), {}, c10::kLong)},
                            dims, c10::kLong, window_attrs, combiner("stablehlo.maximum", c10::kLong));
    const Operand best_key = binary("stablehlo.shift_right_arithmetic", best, number(32), c10::kLong);
    const Operand low = binary("stablehlo.and", best, number(low_bits), c10::kLong);
    set(n, 0, op("stablehlo.bitcast_convert", {as(flip_negative(best_key), c10::kInt)}, dims, t));
    set(n, 1, select(compare("EQ", best_key, number(nan_bits), c10::kLong), low,
                     binary("stablehlo.subtract", number(low_bits), low, c10::kLong)));
    return;
  }
  // (a, ai) or (b, bi): a NaN over a number, of two NaNs the larger index (libtorch's last), of
  // two numbers the larger, of equal ones the smaller index.
  const std::string v = mlir_type({}, t), l = mlir_type({}, c10::kLong);
  const std::string a = fresh(), ai = fresh(), b = fresh(), bi = fresh(), gt = fresh(), eq = fresh(), lt = fresh(),
                    later = fresh(), a_nan = fresh(), b_nan = fresh(), b_num = fresh(), tie = fresh(), larger = fresh(),
                    by_value = fresh(), nan_wins = fresh(), nan_pick = fresh(), pick = fresh(), rv = fresh(), ri = fresh();
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
      op_n("stablehlo.reduce_window",
           {x, plane_index(x.dims), splat(-std::numeric_limits<double>::infinity(), {}, t),
            splat(std::numeric_limits<int64_t>::max(), {}, c10::kLong)},
           {{dims, t}, {dims, c10::kLong}}, window_attrs, region);
  set(n, 0, outs[0]);
  set(n, 1, outs[1]);
}

// (grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices) -> grad_input:
// each grad_output element added at the position the forward's indices name in its plane. When
// the windows do not overlap (stride == kernel, no dilation: the usual 2x2 pooling) a position
// lies in at most one window, so its gradient is that window's where the window's index names
// it and 0 elsewhere: an elementwise select over grad_output and indices upsampled to the
// input's shape, which XLA fuses with what follows. Otherwise a scatter-add over the flattened
// input (XLA:CPU runs a scatter as one sequential loop: 10x eager on the CNN's pools).
bool Emitter::windows_tile(const Node* n) {
  const Dims kernel = spatial_arg(n, 2, "kernel_size", 2, {});
  return spatial_arg(n, 3, "stride", 2, kernel) == kernel && spatial_arg(n, 5, "dilation", 2, {1}) == Dims{1, 1};
}

std::optional<Operand> Emitter::tiled_pool_backward(const Node* n, const Operand& grad) {
  const Dims dims = out_dims(n);
  const size_t rank = dims.size();
  if (rank != 3 && rank != 4) throw Unsupported{"input of " + std::to_string(rank) + " dimensions"};
  if (!windows_tile(n)) return std::nullopt;
  const Dims kernel = spatial_arg(n, 2, "kernel_size", 2, {});
  const Dims padding = spatial_arg(n, 4, "padding", 2, {0});
  const Operand indices = as(in(n, 7), c10::kLong);
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
    const Operand b = op("stablehlo.broadcast_in_dim", {v}, big, v.dtype, "broadcast_dimensions = " + i64_array(map));
    const Operand r = reshape(b, joined);
    if (r.dims == dims) return r;
    return op("stablehlo.pad", {r, splat(fill, {}, v.dtype)}, dims, v.dtype,
              "edge_padding_high = " + i64_array(high) + ", edge_padding_low = " + i64_array(low) +
                  ", interior_padding = " + i64_array(Dims(rank, 0)));
  };
  return select(compare("EQ", upsampled(indices, -1), plane_index(dims), c10::kLong), upsampled(grad, 0),
                splat(0, {}, grad.dtype));
}

void Emitter::max_pool2d_with_indices_backward(const Node* n) {
  const c10::ScalarType t = out_dtype(n);
  const Operand grad = as(in(n, 0), t);
  if (std::optional<Operand> tiled = tiled_pool_backward(n, grad)) {
    set(n, 0, std::move(*tiled));
    return;
  }
  const Dims dims = out_dims(n);
  const size_t rank = dims.size();
  const Dims padding = spatial_arg(n, 4, "padding", 2, {0});
  const Operand indices = as(in(n, 7), c10::kLong);
  const int64_t plane = dims[rank - 1] * dims[rank - 2];
  int64_t total = 1, k = 1;
  for (int64_t d : dims) total *= d;
  for (int64_t d : grad.dims) k *= d;
  // The plane of each grad_output element: its flat index over the leading dims.
  Operand plane_index = splat(0, grad.dims, c10::kLong);
  for (size_t i = 0; i + 2 < rank; ++i) {
    int64_t stride = 1;
    for (size_t j = i + 1; j + 2 < rank; ++j) stride *= grad.dims[j];
    const Operand iota = op("stablehlo.iota", {}, grad.dims, c10::kLong, "iota_dimension = " + std::to_string(i) + " : i64");
    plane_index = add(plane_index, mul(iota, number(stride)));
  }
  const Operand where = reshape(add(mul(plane_index, number(plane)), indices), {k});
  const std::string numbers =
      "scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], "
      "index_vector_dim = 1>, indices_are_sorted = false, unique_indices = false";
  const Operand flat = op("stablehlo.scatter", {splat(0, {total}, t), where, reshape(grad, {k})}, {total}, t, numbers,
                          combiner("stablehlo.add", t));
  set(n, 0, reshape(flat, dims));
}

// A ReLU before a max pool (the MNIST CNN's conv -> relu -> pool) has the backward
// threshold_backward(max_pool2d_with_indices_backward(g, x, ...), x, threshold): the pool's
// backward puts each g at its window's maximum, then the threshold zeroes the elements of x at or
// below it. When the windows do not overlap each element of x gets at most one g, from the window
// whose maximum it is, and there x equals that window's pooled value (the pool's output 0). So the
// threshold can be applied to g against the pooled values first, at a quarter of the size, and
// the result is the same element for element. What it saves: the unfused form reads x again, and
// XLA recomputes x there when x is its own elementwise work (the CNN's conv1 on XLA's own
// convolutions, a sum of 25 shifted windows, once more per step; bench/history/libtorch-1.13.md).
std::optional<Operand> Emitter::threshold_before_pool_backward(const Node* n) {
  static const c10::Symbol kPool = c10::Symbol::fromQualString("aten::max_pool2d_with_indices");
  static const c10::Symbol kPoolBackward = c10::Symbol::fromQualString("aten::max_pool2d_with_indices_backward");
  const Node* backward = n->input(0)->node();
  if (backward->kind() != kPoolBackward || backward->input(1) != n->input(1) || !windows_tile(backward))
    return std::nullopt;
  const Value* indices = backward->input(7);
  const Node* pool = indices->node();
  if (pool->kind() != kPool || pool->output(1) != indices || pool->input(0) != n->input(1)) return std::nullopt;
  const auto pooled = values_.find(pool->output(0));
  if (pooled == values_.end()) return std::nullopt;
  const c10::ScalarType t = out_dtype(n);
  const Operand below = compare("LE", pooled->second, in(n, 2), pooled->second.dtype);
  const Operand g = select(below, splat(0, {}, t), as(in(backward, 0), t));
  return tiled_pool_backward(backward, g);
}

const std::unordered_map<std::string, Emitter::Lowering>& Emitter::lowerings() {
  static const std::unordered_map<std::string, Lowering> table = {
      // libtorch 2.x's lazy lowering passes a scalar argument (alpha, beta, a threshold) as a 0-d
      // tensor parameter converted by ScalarImplicit: a number of that tensor's dtype.
      {"aten::threshold_backward",
       [](Emitter& e, const Node* n) {
         // self <= threshold ? 0 : grad
         if (std::optional<Operand> r = e.threshold_before_pool_backward(n)) {
           e.set(n, 0, std::move(*r));
           return;
         }
         const c10::ScalarType t = out_dtype(n);
         const Operand& self = e.in(n, 1);
         const Operand below = e.compare("LE", self, e.in(n, 2), self.dtype);
         e.set(n, 0, e.select(below, e.splat(0, {}, t), e.as(e.in(n, 0), t)));
       }},
      {"aten::convolution", [](Emitter& e, const Node* n) { e.convolution(n); }},
      {"aten::convolution_backward", [](Emitter& e, const Node* n) { e.convolution_backward(n); }},
      {"aten::max_pool2d_with_indices", [](Emitter& e, const Node* n) { e.max_pool2d_with_indices(n); }},
      {"aten::max_pool2d_with_indices_backward",
       [](Emitter& e, const Node* n) { e.max_pool2d_with_indices_backward(n); }},
  };
  return table;
}

Emission Emitter::run() {
  std::unordered_set<const Node*>& live = live_;
  std::vector<const Value*> pending(graph_.outputs().begin(), graph_.outputs().end());
  while (!pending.empty()) {
    const Node* n = pending.back()->node();
    pending.pop_back();
    if (n == graph_.param_node() || !live.insert(n).second) continue;
    for (const Value* v : n->inputs()) pending.push_back(v);
  }

  Emission result;
  auto record = [&](const std::string& what) {
    if (std::find(result.unsupported.begin(), result.unsupported.end(), what) == result.unsupported.end())
      result.unsupported.push_back(what);
  };
  for (const Node* n : graph_.nodes()) {
    if (!live.count(n) || n->kind() == c10::prim::Constant) continue;
    const char* kind = n->kind().toQualString();
    if (!rules().find(kind) && !lowerings().count(kind)) record(kind);
  }
  if (!result.unsupported.empty()) return result;

  std::vector<std::string> input_types(graph_.inputs().size());
  for (size_t i = 0; i < graph_.inputs().size(); ++i) {
    const Value* v = graph_.inputs()[i];
    try {
      Operand x = operand_of_input(v);
      x.ssa = "%a" + std::to_string(i);
      input_types[i] = mlir_type(x.dims, x.dtype);
      values_[v] = std::move(x);
    } catch (const Unsupported& u) {
      record("graph input " + std::to_string(i) + " (" + u.what + ")");
    }
  }
  if (!result.unsupported.empty()) return result;

  std::unordered_set<const Value*> poisoned;  // outputs of nodes that could not be lowered
  for (const Node* n : graph_.nodes()) {
    if (!live.count(n)) continue;
    if (n->kind() == c10::prim::Constant) {
      const Value* v = n->output();
      const auto value = torch::jit::toIValue(v);
      if (value && (value->isInt() || value->isDouble() || value->isBool())) {
        const c10::ScalarType t = value->isInt() ? c10::kLong : value->isDouble() ? c10::kDouble : c10::kBool;
        values_[v] = Operand{"", {}, t, Tier::number, value->toScalar()};
      }
      continue;
    }
    if (std::any_of(n->inputs().begin(), n->inputs().end(), [&](const Value* v) { return poisoned.count(v) > 0; })) {
      for (const Value* v : n->outputs()) poisoned.insert(v);
      continue;
    }
    try {
      if (const Rule rule = rules().find(n->kind().toQualString())) {
        rule(*this, n);
      } else {
        lowerings().at(n->kind().toQualString())(*this, n);
      }
    } catch (const Unsupported& u) {
      record(std::string(n->kind().toQualString()) + " (" + u.what + ")");
      for (const Value* v : n->outputs()) poisoned.insert(v);
    } catch (const c10::Error& e) {
      // A constant argument of another type than the lowering reads (an overload it does not know).
      record(std::string(n->kind().toQualString()) + " (arguments " + e.what_without_backtrace() + ")");
      for (const Value* v : n->outputs()) poisoned.insert(v);
    }
  }
  if (!result.unsupported.empty()) return result;

  std::vector<Operand> outputs;
  for (const Value* v : graph_.outputs()) {
    const auto it = values_.find(v);
    if (it == values_.end())
      throw std::invalid_argument("graph output %" + v->debugName() + " (" + v->type()->repr_str() +
                                  ") is not a tensor or number the emitter made");
    outputs.push_back(materialized(it->second));
  }
  for (size_t k : updated_inputs_) outputs.push_back(materialized(values_.at(graph_.inputs()[k])));
  result.updated_inputs = updated_inputs_;
  std::vector<std::string> output_types;
  std::string types;  // of the results, comma-separated
  for (const Operand& o : outputs) {
    output_types.push_back(mlir_type(o.dims, o.dtype));
    types += (types.empty() ? "" : ", ") + output_types.back();
  }
  // The aliases asked for whose input and result have one type and whose input has one use,
  // the first of each input and result kept. An updated input is not aliased: its tensor keeps
  // holding the data, so it could never be donated, and the plugin would copy it each run.
  std::vector<int64_t> alias_of(input_types.size(), -1);
  std::vector<bool> result_taken(outputs.size(), false);
  for (const Alias& a : aliases_) {
    if (a.input >= input_types.size() || a.result >= outputs.size() || alias_of[a.input] >= 0 ||
        result_taken[a.result] || input_types[a.input] != output_types[a.result] ||
        std::find(updated_inputs_.begin(), updated_inputs_.end(), a.input) != updated_inputs_.end())
      continue;
    // Only an input that one op reads: XLA then writes the result over it in place. One the
    // graph reads elsewhere too (a weight, read by the forward and backward as well as by its
    // update) makes XLA order those reads first or copy it; on the MNIST CNN aliasing the
    // weights as well made the step 1.05x slower, the optimizer state alone 0.97x
    // (bench/history/libtorch-1.13.md).
    if (graph_.inputs()[a.input]->uses().size() != 1) continue;
    alias_of[a.input] = static_cast<int64_t>(a.result);
    result_taken[a.result] = true;
  }
  std::ostringstream signature;
  signature << "  func.func @main(";
  for (size_t i = 0; i < input_types.size(); ++i) {
    signature << (i ? ", " : "") << "%a" << i << ": " << input_types[i];
    if (alias_of[i] >= 0) {
      signature << " {tf.aliasing_output = " << alias_of[i] << " : i32}";
      result.aliases.push_back({i, static_cast<size_t>(alias_of[i])});
    }
  }
  signature << ") -> (" << types << ") {\n";

  std::ostringstream module;
  module << "module {\n" << signature.str() << body() << "    \"func.return\"(";
  for (size_t i = 0; i < outputs.size(); ++i) module << (i ? ", " : "") << outputs[i].ssa;
  module << ") : (" << types << ") -> ()\n  }\n}\n";
  result.module = module.str();
  return result;
}

}  // namespace

Emission emit_stablehlo(const torch::jit::Graph& graph, const EmitOptions& options, const std::vector<Alias>& aliases) {
  return Emitter(graph, options, aliases).run();
}

std::vector<size_t> inputs_updated_in_place(const torch::jit::Graph& graph) {
  std::vector<size_t> out;
  for (const Node* n : graph.nodes()) {
    if (n->kind() != c10::Symbol::fromQualString("aten::native_batch_norm") || n->inputs().size() < 6) continue;
    const auto training = torch::jit::toIValue(n->input(5));
    if (!training || !training->isBool() || !training->toBool()) continue;
    for (size_t i : {3, 4}) {
      const Value* v = n->input(i);
      if (v->node() == graph.param_node() && v->type()->cast<c10::TensorType>()) out.push_back(v->offset());
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace fulgur::xla::stablehlo
