// SPDX-License-Identifier: Apache-2.0
#pragma once
// Graph passes the emitter runs before lowering (emitter.cpp): rewrites of the TorchScript graph
// into an equal graph that lowers to a faster program. Each keeps the graph's inputs, outputs and
// meaning; a graph that the TorchScript interpreter runs is never rewritten. Private to the
// emitter.

namespace torch::jit {
struct Graph;
}

namespace fulgur::xla::stablehlo {

// Whether move_thresholds_before_tiled_pools() would change `graph`.
bool has_threshold_after_tiled_pool(const torch::jit::Graph& graph);

// A ReLU before a max pool (the MNIST CNN's conv -> relu -> pool) has the backward
// threshold_backward(max_pool2d_with_indices_backward(g, x, ...), x, threshold): the pool's
// backward puts each g at its window's maximum, then the threshold zeroes the elements of x at
// or below it. Each element of x that gets a g is the maximum of that g's window, so x equals
// the window's pooled value (the pool's output 0) there, and the threshold can be applied to g
// against the pooled values first, at the pool's output size:
//   max_pool2d_with_indices_backward(threshold_backward(g, pooled, threshold), x, ...)
// gives the same elements. Rewritten where the windows do not overlap (stride == kernel, no
// dilation: the pool's backward is then an elementwise select, rules/pool.cpp) and the pool's
// backward has no other use. What it saves: the unfused form reads x again, and XLA recomputes
// x there when x is its own elementwise work (the CNN's conv1 as a sum of 25 shifted windows,
// once more per step; bench/history/libtorch-1.13.md).
void move_thresholds_before_tiled_pools(torch::jit::Graph& graph);

}  // namespace fulgur::xla::stablehlo
