// SPDX-License-Identifier: Apache-2.0
#pragma once
// Autocast for lazy (xla) tensors: bf16-mixed on xla (lazy_autocast.cpp).
//
// libtorch's autocast is a dispatch key per backend (AutocastCPU, AutocastCUDA, AutocastXLA,
// ...) that a tensor carries when its backend has one; a lazy tensor's backend (Lazy) has none,
// so CPU or CUDA autocast never sees the ops of an xla step. libtorch leaves the AutocastXLA key
// to torch_xla, which registers its kernels there; fulgur registers its own on that key
// (casting lazy tensors, the ones its xla device makes) and, while a step runs under
// bf16-mixed, puts the key in the thread's included dispatch keys, since lazy tensors do not
// carry it. The casts are then ops of the traced graph, as torch_xla's autocast makes them.

#include <c10/core/ScalarType.h>

namespace fulgur::xla::detail {

// What enter_lazy_autocast found, for exit_lazy_autocast to restore.
struct LazyAutocastState {
  bool included = false;  // AutocastXLA in the thread's included keys
  bool enabled = false;   // at::autocast::is_autocast_enabled(kXLA)
  c10::ScalarType dtype = c10::kBFloat16;
};

// Registers the AutocastXLA kernels (once per process), then turns autocast to `dtype` on for
// the lazy tensors of this thread: matrix products and convolutions (mm, bmm, addmm, baddbmm,
// matmul, linear, conv*, conv_transpose*) take their floating-point lazy operands in `dtype`;
// softmax, log_softmax, the norms (layer, group, batch), the losses and the sum, mean, exp, log
// and pow take them in float32; other ops run as given (type promotion mixes the two, as with
// libtorch's autocast). Returns the state it replaced.
LazyAutocastState enter_lazy_autocast(c10::ScalarType dtype);
void exit_lazy_autocast(const LazyAutocastState& previous);

}  // namespace fulgur::xla::detail
