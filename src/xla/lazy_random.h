// SPDX-License-Identifier: Apache-2.0
#pragma once
// Random ops on the lazy device from fulgur's device generator (lazy_random.cpp,
// <fulgur/xla/random.h>).

namespace fulgur::xla::detail {

// Registers, once per process, the Lazy-key kernels of native_dropout, bernoulli, uniform and
// normal, and the TorchScript ops fulgur::rng_uniform / fulgur::rng_normal (with host kernels,
// for graphs the TorchScript interpreter runs). The lazy backends call it when they start.
void install_lazy_random_kernels();

}  // namespace fulgur::xla::detail
