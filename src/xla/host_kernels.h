// SPDX-License-Identifier: Apache-2.0
#pragma once
// Host kernels that XLA:CPU programs call: libtorch's own CPU convolutions, registered with the
// CPU plugin through PJRT's FFI extension and reached from a compiled program by
// stablehlo.custom_call (api_version 4, XLA's typed FFI). XLA:CPU runs a stablehlo.convolution
// as Eigen's spatial convolution; with these, the rest of the graph stays XLA's, fused as before,
// and each convolution runs the kernel an eager step runs. Which is faster depends on the
// machine (bench/history/libtorch-1.13.md measures both).
//
// Targets (the emitter writes them, xla/stablehlo/emitter.h, EmitOptions::host_convolutions):
//   kConvolution(input, weight[, bias]) -> output, attributes stride, padding, dilation
//     (i64 arrays, one per spatial dim) and groups (i64): aten::convolution, not transposed.
//   kConvolutionBackward(grad_output, input, weight) -> the outputs output_mask (an i64 array
//     of 3 flags) asks for, in the order grad_input, grad_weight, grad_bias; same attributes:
//     aten::convolution_backward.
// Buffers are dense row-major (XLA's default layout for a custom call's operands), float32 or
// float64.

namespace fulgur::xla::pjrt {
class Plugin;
}

namespace fulgur::xla::host_kernels {

inline constexpr const char* kConvolution = "fulgur_convolution";
inline constexpr const char* kConvolutionBackward = "fulgur_convolution_backward";

// Registers the targets with `plugin` for platform "cpu". Throws PjrtError if the plugin cannot
// take them. Call once per plugin, before compiling a program that uses them.
void register_with(const pjrt::Plugin& plugin);

}  // namespace fulgur::xla::host_kernels
