// SPDX-License-Identifier: Apache-2.0
// Matrix product rules: mm, bmm and addmm as stablehlo.dot_general (XLA:CPU accumulates 16-bit
// floats in float32 there, as libtorch's BLAS does).

#include "xla/stablehlo/lowering.h"

namespace fulgur::xla::stablehlo {
namespace {

void mm(LoweringContext& cx, const Node* n) {
  cx.set(n, 0, cx.dot(cx.in(n, 0), cx.in(n, 1), {}, 1, 0, cx.out_dtype(n)));
}

void bmm(LoweringContext& cx, const Node* n) {
  cx.set(n, 0, cx.dot(cx.in(n, 0), cx.in(n, 1), {0}, 2, 1, cx.out_dtype(n)));
}

// beta * self + alpha * (mat1 @ mat2); self is ignored when beta is 0 (no nan from it), as in
// libtorch.
void addmm(LoweringContext& cx, const Node* n) {
  const c10::ScalarType t = cx.out_dtype(n);
  const Operand prod = cx.scaled(cx.dot(cx.in(n, 1), cx.in(n, 2), {}, 1, 0, t), cx.in(n, 4));
  const Operand& beta = cx.in(n, 3);
  if (beta.constant && beta.constant->equal(0)) {
    cx.set(n, 0, prod);
    return;
  }
  Operand self = cx.scaled(cx.broadcast_to(cx.as(cx.in(n, 0), t), prod.dims), beta);
  if (!beta.constant) {
    const Operand is_zero = cx.compare("EQ", beta, number(0), beta.dtype);
    self = cx.select(is_zero, cx.splat(0, prod.dims, t), self);
  }
  cx.set(n, 0, cx.binary("stablehlo.add", self, prod, t));
}

}  // namespace

void add_linalg_rules(RuleTable& table) {
  table.add("aten::mm", mm, "StableHlo.MatmulsWithAlphaAndBeta");
  table.add("aten::bmm", bmm, "StableHlo.MatmulsWithAlphaAndBeta");
  table.add("aten::addmm", addmm, "StableHlo.MatmulsWithAlphaAndBeta");
}

}  // namespace fulgur::xla::stablehlo
