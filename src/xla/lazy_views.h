// SPDX-License-Identifier: Apache-2.0
#pragma once
// Lazy-key kernels that keep torch::nn's recurrent modules on the lazy device (lazy_views.cpp).

namespace fulgur::xla::detail {

// Registers them once per process; the lazy backends call it when they start.
void install_lazy_view_kernels();

}  // namespace fulgur::xla::detail
