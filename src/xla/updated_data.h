// SPDX-License-Identifier: Apache-2.0
#pragma once
// Device data that an in-place update replaces, marked with the lazy node output that computes
// its new value (LazyAdamStep marks Adam's state this way). The PJRT lowering aliases such a
// graph parameter to the graph's result for that output, so that XLA may write the new value
// into the old buffer (the backend donates it when nothing else holds it). libtorch 2.x's lazy
// core sets up no input/output aliases of its own.

#include <torch/csrc/lazy/backend/backend_data.h>
#include <torch/csrc/lazy/core/ir.h>

#include <memory>

namespace fulgur::xla {

struct UpdatedBy : torch::lazy::BackendData::Info {
  explicit UpdatedBy(const torch::lazy::Value& v) : node(v.node), index(v.index) {}
  // Weak: a mark outlives the step that used it only on data nothing updates any more.
  std::weak_ptr<torch::lazy::Node> node;
  size_t index;

  bool is(const torch::lazy::Output& out) const {
    const auto n = node.lock();
    return n && n.get() == out.node && index == out.index;
  }
};

}  // namespace fulgur::xla
