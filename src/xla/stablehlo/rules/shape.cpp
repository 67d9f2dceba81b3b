// SPDX-License-Identifier: Apache-2.0
// Shape rules: views and copies (view, expand, transpose, permute, squeeze, _to_copy's dtype
// conversion), slicing and select with their scatters, cat and stack, and the int arguments the lazy
// lowering passes as 0-d tensors. None computes beyond a conversion; each moves or copies values.

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

// (self, src, dim, index): self with the slice select_copy would read replaced by src (the
// backward of select): src, given back the selected dim, padded to self's shape, and a mask
// padded the same way choosing it.
void select_scatter(LoweringContext& cx, const Node* n) {
  const c10::ScalarType t = cx.out_dtype(n);
  const Operand self = cx.as(cx.in(n, 0), t);
  const Dims dims = cx.out_dims(n);
  if (dims.empty()) throw Unsupported{"a 0-d input"};
  const int64_t dim = wrap_dim(cx.int_arg(n, 2, "dim"), dims.size());
  int64_t index = cx.int_arg(n, 3, "index");
  if (index < -dims[dim] || index >= dims[dim])
    throw std::invalid_argument("select_scatter: index " + std::to_string(index) + " out of range for a dim of " +
                                std::to_string(dims[dim]));
  if (index < 0) index += dims[dim];
  Dims one = dims;
  one[dim] = 1;
  const Operand src = cx.reshape(cx.materialized(cx.as(cx.in(n, 1), t)), one);
  Dims low(dims.size(), 0), high(dims.size(), 0), interior(dims.size(), 0);
  low[dim] = index;
  high[dim] = dims[dim] - index - 1;
  const std::string attrs = "edge_padding_high = " + i64_array(high) + ", edge_padding_low = " + i64_array(low) +
                            ", interior_padding = " + i64_array(interior);
  const Operand spread = cx.op("stablehlo.pad", {src, cx.splat(0, {}, t)}, dims, t, attrs);
  const Operand mask =
      cx.op("stablehlo.pad", {cx.splat(true, one, c10::kBool), cx.splat(false, {}, c10::kBool)}, dims, c10::kBool, attrs);
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

// A list of tensors (the operand of cat and stack), kept for the op that reads it.
void list_construct(LoweringContext& cx, const Node* n) {
  const auto list = n->output()->type()->cast<c10::ListType>();
  if (!list || !list->getElementType()->cast<c10::TensorType>())
    throw Unsupported{"a list of " + n->output()->type()->repr_str()};
  std::vector<Operand> elements;
  for (size_t i = 0; i < n->inputs().size(); ++i) elements.push_back(cx.materialized(cx.in(n, i)));
  cx.set_list(n->output(), std::move(elements));
}

// (tensors, dim): cat joins along dim; stack (insert) first gives every tensor a dim of size 1
// there. Every tensor is converted to the result's dtype.
void concatenate(LoweringContext& cx, const Node* n, bool insert) {
  const std::vector<Operand>* tensors = cx.list(n->input(0));
  if (!tensors) throw Unsupported{"tensors that are not a prim::ListConstruct"};
  const c10::ScalarType t = cx.out_dtype(n);
  const Dims dims = cx.out_dims(n);
  const int64_t dim = wrap_dim(cx.int_arg(n, 1, "dim"), dims.size());
  std::vector<Operand> parts;
  for (const Operand& x : *tensors) {
    if (!insert && x.dims.size() == 1 && x.dims[0] == 0) continue;  // cat skips empty 1-d tensors
    Dims d = x.dims;
    if (insert) d.insert(d.begin() + dim, 1);
    parts.push_back(cx.reshape(cx.as(x, t), d));
  }
  if (parts.size() == 1) {
    cx.set(n, 0, cx.reshape(parts[0], dims));
    return;
  }
  cx.set(n, 0, cx.op("stablehlo.concatenate", parts, dims, t, "dimension = " + std::to_string(dim) + " : i64"));
}

// (self, dim, index): the slice at `index` of `dim`, that dim dropped.
void select_copy(LoweringContext& cx, const Node* n) {
  const Operand x = cx.materialized(cx.in(n, 0));
  if (x.dims.empty()) throw Unsupported{"a 0-d input"};
  const int64_t dim = wrap_dim(cx.int_arg(n, 1, "dim"), x.dims.size());
  int64_t index = cx.int_arg(n, 2, "index");
  if (index < -x.dims[dim] || index >= x.dims[dim])
    throw std::invalid_argument("select_copy: index " + std::to_string(index) + " out of range for a dim of " +
                                std::to_string(x.dims[dim]));
  if (index < 0) index += x.dims[dim];
  Dims start(x.dims.size(), 0), limit = x.dims, strides(x.dims.size(), 1);
  start[dim] = index;
  limit[dim] = index + 1;
  cx.set(n, 0, cx.reshape(cx.slice(x, start, limit, strides), cx.out_dims(n)));
}

void stack(LoweringContext& cx, const Node* n) { concatenate(cx, n, true); }
void cat(LoweringContext& cx, const Node* n) { concatenate(cx, n, false); }

// detach_copy and expand_copy: self broadcast to the output's shape.
void broadcast(LoweringContext& cx, const Node* n) { cx.set(n, 0, cx.broadcast_to(cx.in(n, 0), cx.out_dims(n))); }

// _to_copy: self converted to the output's dtype (a device or layout change is no op here).
void to_copy(LoweringContext& cx, const Node* n) {
  cx.set(n, 0, cx.broadcast_to(cx.as(cx.in(n, 0), cx.out_dtype(n)), cx.out_dims(n)));
}

// A 2-d self transposed (a 0-d or 1-d one as it is).
void t_copy(LoweringContext& cx, const Node* n) {
  const Operand x = cx.materialized(cx.in(n, 0));
  cx.set(n, 0, x.dims.size() < 2 ? x
                                 : cx.op("stablehlo.transpose", {x}, {x.dims[1], x.dims[0]}, x.dtype,
                                         "permutation = array<i64: 1, 0>"));
}

// (self, dim0, dim1): the two dims swapped.
void transpose_copy(LoweringContext& cx, const Node* n) {
  const Operand x = cx.materialized(cx.in(n, 0));
  const int64_t a = wrap_dim(cx.int_arg(n, 1, "dim0"), x.dims.size());
  const int64_t b = wrap_dim(cx.int_arg(n, 2, "dim1"), x.dims.size());
  if (x.dims.size() < 2 || a == b) {
    cx.set(n, 0, x);
    return;
  }
  Dims perm(x.dims.size()), dims = x.dims;
  for (size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int64_t>(i);
  std::swap(perm[a], perm[b]);
  std::swap(dims[a], dims[b]);
  cx.set(n, 0, cx.op("stablehlo.transpose", {x}, dims, x.dtype, "permutation = " + i64_array(perm)));
}

// view_copy, squeeze_copy and unsqueeze_copy (every overload), and clone: the values of self in
// the output's shape.
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
  table.add("aten::detach_copy", broadcast, "StableHlo.ZeroCopiesViewsAndTransposes");
  table.add("aten::expand_copy", broadcast, "StableHlo.ZeroCopiesViewsAndTransposes");
  table.add("aten::_to_copy", to_copy, "StableHlo.ZeroCopiesViewsAndTransposes");
  table.add("aten::view_copy", reshaped, "StableHlo.ZeroCopiesViewsAndTransposes");
  table.add("aten::t_copy", t_copy, "StableHlo.ZeroCopiesViewsAndTransposes");
  table.add("aten::transpose_copy", transpose_copy, "StableHlo.ZeroCopiesViewsAndTransposes");
  table.add("prim::ListConstruct", list_construct, "StableHlo.StackCatAndSelectCopy");
  table.add("aten::stack", stack, "StableHlo.StackCatAndSelectCopy");
  table.add("aten::cat", cat, "StableHlo.StackCatAndSelectCopy");
  table.add("aten::select_copy", select_copy, "StableHlo.StackCatAndSelectCopy");
  table.add("aten::IntImplicit", int_implicit, "XlaOps.SlicingAndItsBackward");
  table.add("aten::slice_copy", slice_copy, "XlaOps.SlicingAndItsBackward");
  table.add("aten::slice_scatter", slice_scatter, "XlaOps.SlicingAndItsBackward");
  table.add("aten::select_scatter", select_scatter, "XlaOps.SlicingAndItsBackward");
  table.add("aten::permute_copy", permute_copy, "XlaOps.PermuteSqueezeUnsqueezeAndTheirBackwards");
  table.add("aten::squeeze_copy", reshaped, "XlaOps.PermuteSqueezeUnsqueezeAndTheirBackwards");
  table.add("aten::unsqueeze_copy", reshaped, "XlaOps.PermuteSqueezeUnsqueezeAndTheirBackwards");
  table.add("aten::clone", reshaped, "XlaOps.TriuTrilAndTheirBackwards");
  table.add("aten::expand", expand, "XlaOps.TriuTrilAndTheirBackwards");
}

}  // namespace fulgur::xla::stablehlo
