// Reduction rules: vector norms. 16-bit floats accumulate in float32 and round once, as
// libtorch's kernels do.

#include "xla/stablehlo/lowering.h"

#include <cmath>
#include <limits>

namespace fulgur::xla::stablehlo {
namespace {

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
  auto largest = [&] { return cx.reduce(a, dims, "stablehlo.maximum", 0); };
  auto smallest = [&] { return cx.reduce(a, dims, "stablehlo.minimum", inf); };
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

}  // namespace

void add_reduce_rules(RuleTable& table) { table.add("aten::norm", norm); }

}  // namespace fulgur::xla::stablehlo
