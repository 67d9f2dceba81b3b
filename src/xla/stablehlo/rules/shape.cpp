// Shape rules: slicing and its scatter, permutes, squeezes, expand and clone, and the int
// arguments the lazy lowering passes as 0-d tensors. None computes; each moves or copies values.

#include "xla/stablehlo/lowering.h"

#include <torch/csrc/jit/ir/constants.h>

#include <algorithm>

namespace fulgur::xla::stablehlo {
namespace {

// libtorch 2.x's lazy lowering passes an int argument (a slice's start, end and step) as a 0-d
// tensor converted by IntImplicit, a prim::Constant tensor when the value is fixed: the rule
// makes it a known number then, which rules that need the value when they are emitted read with
// known_number(); otherwise a number of the tensor's value.
void int_implicit(LoweringContext& cx, const Node* n) {
  if (const auto value = torch::jit::toIValue(n->input(0)); value && value->isTensor()) {
    const at::Tensor t = value->toTensor();
    if (t.dim() != 0) throw Unsupported{"a tensor of " + std::to_string(t.dim()) + " dims"};
    cx.set_value(n->output(0), Operand{"", {}, c10::kLong, Tier::number, c10::Scalar(t.item<int64_t>())});
    return;
  }
  const Operand x = cx.materialized(cx.in(n, 0));
  if (!x.dims.empty()) throw Unsupported{"a tensor of " + std::to_string(x.dims.size()) + " dims"};
  cx.set_value(n->output(0), Operand{cx.as(x, c10::kLong).ssa, {}, c10::kLong, Tier::number, x.constant});
}

// The first index and step of a slice of dim `dim` of `dims` by (start, end, step) arguments at
// inputs first..first+2 (None for start means 0), as libtorch's slice clamps a start below 0 or
// beyond the dim.
std::pair<int64_t, int64_t> slice_start_and_step(const LoweringContext& cx, const Node* n, size_t first,
                                                 int64_t size) {
  int64_t start = cx.none_arg(n, first) ? 0 : cx.known_number(n, first, "start").toLong();
  const int64_t step = cx.known_number(n, first + 2, "step").toLong();
  if (step <= 0) throw std::invalid_argument("slice step must be positive, got " + std::to_string(step));
  if (start < 0) start += size;
  return {std::clamp<int64_t>(start, 0, size), step};
}

// (self, dim, start?, end?, step): elements start, start + step, ... of dim, as many as the
// graph's output has.
void slice_copy(LoweringContext& cx, const Node* n) {
  const Operand x = cx.materialized(cx.in(n, 0));
  const Dims out = cx.out_dims(n);
  const int64_t dim = wrap_dim(cx.int_arg(n, 1, "dim"), x.dims.size());
  const auto [start, step] = slice_start_and_step(cx, n, 2, x.dims[dim]);
  Dims first(x.dims.size(), 0), limit = x.dims, strides(x.dims.size(), 1);
  first[dim] = start;
  limit[dim] = out[dim] == 0 ? start : start + (out[dim] - 1) * step + 1;
  strides[dim] = step;
  cx.set(n, 0, cx.slice(x, first, limit, strides));
}

// (self, src, dim, start?, end?, step): self with the slice that slice_copy would read replaced by
// src (the backward of slicing): src spread to self's shape with stablehlo.pad (its elements
// step apart), and a mask padded the same way choosing it.
void slice_scatter(LoweringContext& cx, const Node* n) {
  const c10::ScalarType t = cx.out_dtype(n);
  const Operand self = cx.as(cx.in(n, 0), t), src = cx.as(cx.in(n, 1), t);
  const Dims dims = cx.out_dims(n);
  const int64_t dim = wrap_dim(cx.int_arg(n, 2, "dim"), dims.size());
  const auto [start, step] = slice_start_and_step(cx, n, 3, dims[dim]);
  const int64_t count = src.dims.at(dim);
  Dims low(dims.size(), 0), high(dims.size(), 0), interior(dims.size(), 0);
  low[dim] = start;
  interior[dim] = count > 0 ? step - 1 : 0;
  high[dim] = dims[dim] - start - (count > 0 ? (count - 1) * step + 1 : 0);
  const std::string attrs = "edge_padding_high = " + i64_array(high) + ", edge_padding_low = " + i64_array(low) +
                            ", interior_padding = " + i64_array(interior);
  const Operand spread = cx.op("stablehlo.pad", {cx.materialized(src), cx.splat(0, {}, t)}, dims, t, attrs);
  const Operand mask = cx.op("stablehlo.pad", {cx.splat(true, src.dims, c10::kBool), cx.splat(false, {}, c10::kBool)},
                             dims, c10::kBool, attrs);
  cx.set(n, 0, cx.select(mask, spread, cx.broadcast_to(self, dims)));
}

// (self, dims): dim i of the result is dim dims[i] of self.
void permute_copy(LoweringContext& cx, const Node* n) {
  const Operand x = cx.materialized(cx.in(n, 0));
  Dims perm = cx.ints_arg(n, 1, "dims");
  for (int64_t& d : perm) d = wrap_dim(d, x.dims.size());
  if (x.dims.size() < 2) {
    cx.set(n, 0, x);
    return;
  }
  cx.set(n, 0, cx.op("stablehlo.transpose", {x}, cx.out_dims(n), x.dtype, "permutation = " + i64_array(perm)));
}

// squeeze_copy and unsqueeze_copy (every overload), and clone: the values of self in the
// output's shape.
void reshaped(LoweringContext& cx, const Node* n) {
  cx.set(n, 0, cx.reshape(cx.materialized(cx.in(n, 0)), cx.out_dims(n)));
}

// (self, size, implicit): self broadcast to `size` (-1 keeps self's dim), as expand_copy. The
// lazy lowering writes this op before an aten::clone for a scalar it expands (torch::ones,
// torch::full on the device) and leaves its output untyped, so the dims come from `size`.
void expand(LoweringContext& cx, const Node* n) {
  const Operand& x = cx.in(n, 0);
  Dims dims = cx.ints_arg(n, 1, "size");
  if (dims.size() < x.dims.size()) throw std::invalid_argument("expand to fewer dims than the input's");
  for (size_t i = 0; i < dims.size(); ++i) {
    const size_t lead = dims.size() - x.dims.size();
    if (dims[i] == -1) {
      if (i < lead) throw std::invalid_argument("expand: -1 for a new leading dim");
      dims[i] = x.dims[i - lead];
    }
  }
  cx.set_value(n->output(0), cx.broadcast_to(x, dims));
}

}  // namespace

void add_shape_rules(RuleTable& table) {
  table.add("aten::IntImplicit", int_implicit);
  table.add("aten::slice_copy", slice_copy);
  table.add("aten::slice_scatter", slice_scatter);
  table.add("aten::permute_copy", permute_copy);
  table.add("aten::squeeze_copy", reshaped);
  table.add("aten::unsqueeze_copy", reshaped);
  table.add("aten::clone", reshaped);
  table.add("aten::expand", expand);
}

}  // namespace fulgur::xla::stablehlo
