// SPDX-License-Identifier: Apache-2.0
// The emitter's graph passes; see passes.h.

#include "xla/stablehlo/passes.h"

#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/ir/ir.h>

#include <cstdint>
#include <vector>

namespace fulgur::xla::stablehlo {
namespace {

using torch::jit::Node;

const c10::Symbol kThreshold = c10::Symbol::fromQualString("aten::threshold_backward");
const c10::Symbol kPool = c10::Symbol::fromQualString("aten::max_pool2d_with_indices");
const c10::Symbol kPoolBackward = c10::Symbol::fromQualString("aten::max_pool2d_with_indices_backward");

// A pool's int[] argument as two values (one repeated, `if_empty` for []); empty if it is not a
// constant list of one or two.
std::vector<int64_t> two(const Node* n, size_t i, const std::vector<int64_t>& if_empty) {
  const auto value = torch::jit::toIValue(n->input(i));
  if (!value || !value->isIntList()) return {};
  std::vector<int64_t> v = value->toIntVector();
  if (v.empty()) v = if_empty;
  if (v.size() == 1) v.push_back(v[0]);
  return v.size() == 2 ? v : std::vector<int64_t>{};
}

// The pool's backward of threshold `t` when the rewrite applies, else nullptr.
Node* tiled_pool_backward_before(const Node* t) {
  Node* backward = t->input(0)->node();
  if (backward->kind() != kPoolBackward || backward->input(1) != t->input(1) ||
      backward->output()->uses().size() != 1)
    return nullptr;
  const std::vector<int64_t> kernel = two(backward, 2, {});
  if (kernel.empty() || two(backward, 3, kernel) != kernel || two(backward, 5, {1}) != std::vector<int64_t>{1, 1})
    return nullptr;
  const Node* pool = backward->input(7)->node();
  if (pool->kind() != kPool || pool->outputs().size() != 2 || pool->output(1) != backward->input(7) ||
      pool->input(0) != t->input(1))
    return nullptr;
  return backward;
}

}  // namespace

bool has_threshold_after_tiled_pool(const torch::jit::Graph& graph) {
  for (const Node* n : graph.nodes())
    if (n->kind() == kThreshold && tiled_pool_backward_before(n)) return true;
  return false;
}

void move_thresholds_before_tiled_pools(torch::jit::Graph& graph) {
  std::vector<Node*> thresholds;
  for (Node* n : graph.nodes())
    if (n->kind() == kThreshold) thresholds.push_back(n);
  for (Node* t : thresholds) {
    Node* backward = tiled_pool_backward_before(t);
    if (!backward) continue;
    torch::jit::Value* pooled = backward->input(7)->node()->output(0);
    // threshold_backward(g, pooled, threshold), typed as g (the pool's output size).
    Node* early = graph.create(kThreshold, {backward->input(0), pooled, t->input(2)}, 1);
    early->output()->setType(backward->input(0)->type());
    early->insertBefore(t);
    std::vector<torch::jit::Value*> inputs(backward->inputs().begin(), backward->inputs().end());
    inputs[0] = early->output();
    Node* late = graph.create(kPoolBackward, inputs, 1);
    late->output()->setType(t->output()->type());
    late->insertBefore(t);
    t->output()->replaceAllUsesWith(late->output());
    t->destroy();
    backward->destroy();
  }
}

}  // namespace fulgur::xla::stablehlo
