// SPDX-License-Identifier: Apache-2.0
// Reduction rules: sum and mean, vector norms, max and min (whole, or along a dim with indices),
// topk (a sort along a dim), and all and any of a whole tensor.
// 16-bit floats accumulate in float32 and round once, as libtorch's kernels do.

#include "xla/stablehlo/lowering.h"

#include <cmath>
#include <limits>

namespace fulgur::xla::stablehlo {
namespace {

// sum(self, dim, keepdim, dtype), sum(self, dtype), mean(...) alike: reduced in the output's
// dtype; mean divides the sum by the number of elements reduced.
void sum_or_mean(LoweringContext& cx, const Node* n, bool mean) {
  const c10::ScalarType out = cx.out_dtype(n);
  // 16-bit floats are summed and divided in float32 and rounded once at the end, as libtorch's
  // kernels accumulate them (a bf16 running sum stops growing at 256 + 1, and a count such as
  // 67,600 is not a bf16 number).
  const c10::ScalarType t = accumulation_type(out);
  const Operand x = cx.as(cx.in(n, 0), t);
  Dims dims;
  if (n->inputs().size() > 2) {
    dims = cx.reduced_dims(n, 1, x.dims.size());
  } else {
    for (size_t d = 0; d < x.dims.size(); ++d) dims.push_back(static_cast<int64_t>(d));
  }
  int64_t count = 1;
  for (int64_t d : dims) count *= x.dims[d];
  Operand r = cx.reduce(x, dims, "stablehlo.add", 0);
  if (mean) r = cx.binary("stablehlo.divide", r, Operand{"", {}, c10::kLong, Tier::number, c10::Scalar(count)}, t);
  cx.set(n, 0, cx.reshape(cx.as(r, out), cx.out_dims(n)));
}

void sum(LoweringContext& cx, const Node* n) { sum_or_mean(cx, n, false); }
void mean(LoweringContext& cx, const Node* n) { sum_or_mean(cx, n, true); }

// (self, p?, dim, keepdim): the p-norm over `dim` (every dim for []), as torch.norm: p = 2 when
// None; inf the largest |x|, -inf the smallest, 0 the count of nonzero elements, else
// (sum |x|^p)^(1/p). The lazy core passes p as a graph input (a 0-d tensor read by
// ScalarImplicit), so the program computes the norms p may ask for and selects the one p names
// when it runs; a p known when the graph is emitted gets its norm alone. fulgur's norm
// gradient clipping (gradient_clip_val) runs this for every gradient.
void norm(LoweringContext& cx, const Node* n) {
  if (n->inputs().size() != 4) throw Unsupported{"an overload of " + std::to_string(n->inputs().size()) + " arguments"};
  const c10::ScalarType out = cx.out_dtype(n), t = accumulation_type(out);
  const Operand a = cx.unary("stablehlo.abs", cx.as(cx.in(n, 0), t));
  const Dims dims = cx.reduced_dims(n, 2, a.dims.size());
  const double inf = std::numeric_limits<double>::infinity();
  auto sum = [&](const Operand& v) { return cx.reduce(v, dims, "stablehlo.add", 0); };
  auto two = [&] { return cx.unary("stablehlo.sqrt", sum(cx.mul(a, a))); };
  auto largest = [&] { return cx.reduce_nan(a, dims, "stablehlo.maximum", 0); };
  auto smallest = [&] { return cx.reduce_nan(a, dims, "stablehlo.minimum", inf); };
  auto nonzero = [&] {
    return sum(cx.select(cx.compare("NE", a, cx.splat(0, {}, t), t), cx.splat(1, {}, t), cx.splat(0, {}, t)));
  };
  auto general = [&](const Operand& p) {
    const Operand root = cx.binary("stablehlo.divide", cx.splat(1, {}, t), p, t);
    return cx.binary("stablehlo.power", sum(cx.binary("stablehlo.power", a, p, t)), root, t);
  };
  Operand r;
  if (cx.none_arg(n, 1)) {
    r = two();
  } else if (const Operand& p = cx.in(n, 1); p.constant) {
    const double v = p.constant->toDouble();
    r = v == 2 ? two() : v == inf ? largest() : v == -inf ? smallest() : v == 0 ? nonzero() : general(p);
  } else {
    const Operand pt = cx.as(p, t);
    auto is = [&](double v) { return cx.compare("EQ", pt, number(v), t); };
    r = cx.select(is(2), two(), general(pt));
    r = cx.select(is(inf), largest(), r);
    r = cx.select(is(-inf), smallest(), r);
    r = cx.select(is(0), nonzero(), r);
  }
  cx.set(n, 0, cx.reshape(cx.as(r, out), cx.out_dims(n)));
}

// The region of a variadic reduce over (value, index) pairs that keeps the better value
// (`direction` GT for max, LT for min) and, of equal ones, the smaller index; a NaN beats any
// number and the first of several NaNs wins, as libtorch's max and min along a dim.
std::string arg_region(LoweringContext& cx, c10::ScalarType t, const char* direction) {
  const std::string v = mlir_type({}, t), l = mlir_type({}, c10::kLong), p = mlir_type({}, c10::kBool);
  const std::string a = cx.fresh(), ai = cx.fresh(), b = cx.fresh(), bi = cx.fresh(), better = cx.fresh(),
                    eq = cx.fresh(), first = cx.fresh(), a_nan = cx.fresh(), b_nan = cx.fresh(), b_num = cx.fresh(),
                    tie = cx.fresh(), wins = cx.fresh(), by_value = cx.fresh(), nan_first = cx.fresh(),
                    nan_pick = cx.fresh(), pick = cx.fresh(), rv = cx.fresh(), ri = cx.fresh();
  auto cmp = [&](const std::string& r, const std::string& x, const std::string& y, const std::string& ty,
                 const char* dir) {
    return "      " + r + " = \"stablehlo.compare\"(" + x + ", " + y +
           ") {comparison_direction = #stablehlo<comparison_direction " + dir + ">} : (" + ty + ", " + ty + ") -> " +
           p + "\n";
  };
  auto logic = [&](const std::string& r, const char* what, const std::string& x, const std::string& y) {
    return "      " + r + " = \"stablehlo." + what + "\"(" + x + ", " + y + ") : (" + p + ", " + p + ") -> " + p + "\n";
  };
  return "{\n    ^bb0(" + a + ": " + v + ", " + ai + ": " + l + ", " + b + ": " + v + ", " + bi + ": " + l + "):\n" +
         cmp(better, a, b, v, direction) + cmp(eq, a, b, v, "EQ") + cmp(first, ai, bi, l, "LT") +
         cmp(a_nan, a, a, v, "NE") + cmp(b_nan, b, b, v, "NE") + "      " + b_num + " = \"stablehlo.not\"(" + b_nan +
         ") : (" + p + ") -> " + p + "\n" + logic(tie, "and", eq, first) + logic(wins, "or", better, tie) +
         logic(by_value, "and", b_num, wins) + logic(nan_first, "or", b_num, first) +
         logic(nan_pick, "and", a_nan, nan_first) + logic(pick, "or", nan_pick, by_value) + "      " + rv +
         " = \"stablehlo.select\"(" + pick + ", " + a + ", " + b + ") : (" + p + ", " + v + ", " + v + ") -> " + v +
         "\n      " + ri + " = \"stablehlo.select\"(" + pick + ", " + ai + ", " + bi + ") : (" + p + ", " + l + ", " +
         l + ") -> " + l + "\n      \"stablehlo.return\"(" + rv + ", " + ri + ") : (" + v + ", " + l + ") -> ()\n    }";
}

// The lowest (`lowest`) or the largest value of integer type `t`: the identity of max (min),
// written in `t` itself (a narrower type cannot hold int64's).
c10::Scalar integer_limit(c10::ScalarType t, bool lowest) {
  switch (t) {
    case c10::kByte: return lowest ? int64_t{0} : int64_t{std::numeric_limits<uint8_t>::max()};
    case c10::kChar:
      return int64_t{lowest ? std::numeric_limits<int8_t>::lowest() : std::numeric_limits<int8_t>::max()};
    case c10::kShort:
      return int64_t{lowest ? std::numeric_limits<int16_t>::lowest() : std::numeric_limits<int16_t>::max()};
    case c10::kInt:
      return int64_t{lowest ? std::numeric_limits<int32_t>::lowest() : std::numeric_limits<int32_t>::max()};
    default: return lowest ? std::numeric_limits<int64_t>::lowest() : std::numeric_limits<int64_t>::max();
  }
}

// max(self) / min(self): the largest (smallest) element, NaN if any is NaN. max(self, dim,
// keepdim) / min(...): (values, indices) along dim, the first index of the extreme value
// (arg_region). `is_max` picks which.
void extreme(LoweringContext& cx, const Node* n, bool is_max) {
  const Operand x = cx.materialized(cx.in(n, 0));
  const c10::ScalarType t = x.dtype;
  if (t == c10::kBool) throw Unsupported{"a bool input"};
  const c10::Scalar init = is_floating(t) ? c10::Scalar(is_max ? -std::numeric_limits<double>::infinity()
                                                                : std::numeric_limits<double>::infinity())
                                          : integer_limit(t, is_max);
  const char* body = is_max ? "stablehlo.maximum" : "stablehlo.minimum";
  Dims all;
  for (size_t d = 0; d < x.dims.size(); ++d) all.push_back(static_cast<int64_t>(d));
  if (n->inputs().size() == 1) {
    cx.set(n, 0, cx.reshape(cx.reduce_nan(x, all, body, init), cx.out_dims(n)));
    return;
  }
  if (n->inputs().size() != 3 || n->outputs().size() != 2)
    throw Unsupported{"an overload of " + std::to_string(n->inputs().size()) + " arguments"};
  if (x.dims.empty()) {  // a 0-d tensor: itself, at index 0
    cx.set(n, 0, x);
    cx.set(n, 1, cx.splat(0, {}, c10::kLong));
    return;
  }
  const int64_t dim = wrap_dim(cx.int_arg(n, 1, "dim"), x.dims.size());
  Dims reduced;
  for (size_t d = 0; d < x.dims.size(); ++d)
    if (static_cast<int64_t>(d) != dim) reduced.push_back(x.dims[d]);
  const Operand index =
      cx.op("stablehlo.iota", {}, x.dims, c10::kLong, "iota_dimension = " + std::to_string(dim) + " : i64");
  const Operand no_index = cx.splat(std::numeric_limits<int64_t>::max(), {}, c10::kLong);
  const std::vector<Operand> outs =
      cx.op_n("stablehlo.reduce", {x, index, cx.splat(init, {}, t), no_index}, {{reduced, t}, {reduced, c10::kLong}},
              "dimensions = " + i64_array({dim}), arg_region(cx, t, is_max ? "GT" : "LT"));
  cx.set(n, 0, cx.reshape(outs[0], cx.out_dims(n, 0)));
  cx.set(n, 1, cx.reshape(cx.as(outs[1], cx.out_dtype(n, 1)), cx.out_dims(n, 1)));
}
void max(LoweringContext& cx, const Node* n) { extreme(cx, n, true); }

// The comparator of a stable stablehlo.sort of (value, index) pairs that puts `a` first when it
// is larger (`largest`) or smaller: NaN counts as larger than every number, as in libtorch's
// topk and sort, so it comes first with largest and last without.
std::string topk_region(LoweringContext& cx, c10::ScalarType t, bool largest) {
  const std::string v = mlir_type({}, t), l = mlir_type({}, c10::kLong), p = mlir_type({}, c10::kBool);
  const std::string a = cx.fresh(), b = cx.fresh(), ai = cx.fresh(), bi = cx.fresh(), before = cx.fresh(),
                    a_nan = cx.fresh(), b_nan = cx.fresh(), b_num = cx.fresh(), a_num = cx.fresh(),
                    nan_order = cx.fresh(), r = cx.fresh();
  auto cmp = [&](const std::string& out, const std::string& x, const std::string& y, const char* dir) {
    return "      " + out + " = \"stablehlo.compare\"(" + x + ", " + y +
           ") {comparison_direction = #stablehlo<comparison_direction " + dir + ">} : (" + v + ", " + v + ") -> " +
           p + "\n";
  };
  auto logic = [&](const std::string& out, const char* what, const std::string& x, const std::string& y) {
    return "      " + out + " = \"stablehlo." + what + "\"(" + x + ", " + y + ") : (" + p + ", " + p + ") -> " + p +
           "\n";
  };
  auto negation = [&](const std::string& out, const std::string& x) {
    return "      " + out + " = \"stablehlo.not\"(" + x + ") : (" + p + ") -> " + p + "\n";
  };
  // largest: a before b when a > b or (a is NaN and b is not); smallest: a < b or (b is NaN and
  // a is not). Equal values keep their order (is_stable): the smaller index first.
  return "{\n    ^bb0(" + a + ": " + v + ", " + b + ": " + v + ", " + ai + ": " + l + ", " + bi + ": " + l + "):\n" +
         cmp(before, a, b, largest ? "GT" : "LT") + cmp(a_nan, a, a, "NE") + cmp(b_nan, b, b, "NE") +
         negation(b_num, b_nan) + negation(a_num, a_nan) +
         (largest ? logic(nan_order, "and", a_nan, b_num) : logic(nan_order, "and", a_num, b_nan)) +
         logic(r, "or", before, nan_order) + "      \"stablehlo.return\"(" + r + ") : (" + p + ") -> ()\n    }";
}

// topk(self, k, dim, largest, sorted) -> (values, indices): a stable sort of (value, index)
// pairs along dim (topk_region), its first k. Ties give the smaller index first; unsorted
// (sorted = false) results come sorted, one of the orders libtorch allows.
void topk(LoweringContext& cx, const Node* n) {
  const Operand x = cx.materialized(cx.in(n, 0));
  const c10::ScalarType t = x.dtype;
  if (t == c10::kBool) throw Unsupported{"a bool input"};
  const int64_t k = cx.int_arg(n, 1, "k");
  const bool largest = cx.bool_arg(n, 3, "largest");
  if (x.dims.empty()) {  // a 0-d tensor: k is 0 or 1, the element itself at index 0
    if (k != 1) throw Unsupported{"k " + std::to_string(k) + " of a 0-d tensor"};
    cx.set(n, 0, x);
    cx.set(n, 1, cx.splat(0, {}, c10::kLong));
    return;
  }
  const int64_t dim = wrap_dim(cx.int_arg(n, 2, "dim"), x.dims.size());
  if (k < 0 || k > x.dims[static_cast<size_t>(dim)]) throw Unsupported{"k " + std::to_string(k) + " out of range"};
  const Operand index =
      cx.op("stablehlo.iota", {}, x.dims, c10::kLong, "iota_dimension = " + std::to_string(dim) + " : i64");
  const std::vector<Operand> sorted =
      cx.op_n("stablehlo.sort", {x, index}, {{x.dims, t}, {x.dims, c10::kLong}},
              "dimension = " + std::to_string(dim) + " : i64, is_stable = true", topk_region(cx, t, largest));
  Dims start(x.dims.size(), 0), limit = x.dims, strides(x.dims.size(), 1);
  limit[static_cast<size_t>(dim)] = k;
  cx.set(n, 0, cx.as(cx.slice(sorted[0], start, limit, strides), cx.out_dtype(n, 0)));
  cx.set(n, 1, cx.as(cx.slice(sorted[1], start, limit, strides), cx.out_dtype(n, 1)));
}
void min(LoweringContext& cx, const Node* n) { extreme(cx, n, false); }

// all(self) and any(self): whether every (some) element is nonzero, a 0-d bool (uint8 for a uint8
// input, as libtorch gives it); true (false) for an empty input.
void all_or_any(LoweringContext& cx, const Node* n, bool all) {
  const Operand x = cx.materialized(cx.in(n, 0));
  const Operand nonzero = cx.compare("NE", x, number(0), x.dtype);
  Dims dims;
  for (size_t d = 0; d < x.dims.size(); ++d) dims.push_back(static_cast<int64_t>(d));
  const Operand r = cx.reduce(nonzero, dims, all ? "stablehlo.and" : "stablehlo.or", all);
  cx.set(n, 0, cx.as(r, cx.out_dtype(n)));
}

void all(LoweringContext& cx, const Node* n) { all_or_any(cx, n, true); }
void any(LoweringContext& cx, const Node* n) { all_or_any(cx, n, false); }

}  // namespace

void add_reduce_rules(RuleTable& table) {
  table.add("aten::sum", sum, "StableHlo.ReductionsComparisonsReluAndThresholdBackward");
  table.add("aten::mean", mean, "StableHlo.ReductionsComparisonsReluAndThresholdBackward");
  table.add("aten::norm", norm, "XlaOps.NormOfEveryOrderAndItsBackward");
  table.add("aten::max", max, "XlaOps.MaxAndMinWithIndicesTiesAndNan");
  table.add("aten::min", min, "XlaOps.MaxAndMinWithIndicesTiesAndNan");
  table.add("aten::topk", topk, "XlaOps.TopkLargestAndSmallestAlongEachDim");
  table.add("aten::all", all, "XlaOps.AllAnyAndEqual");
  table.add("aten::any", any, "XlaOps.AllAnyAndEqual");
}

}  // namespace fulgur::xla::stablehlo
