// SPDX-License-Identifier: Apache-2.0
#pragma once
// The op kinds the `xla` device compiles to StableHLO: every kind the emitter has a lowering rule
// for, the rule family it belongs to (src/xla/stablehlo/rules/<family>.cpp) and the per-op test
// that checks it against eager libtorch. A graph with a kind not listed here runs on the
// TorchScript interpreter instead (BackendMetrics::xla_fallbacks names the kind). The
// fulgur-xla-ops program prints this list.
//
// Thread safety: lowered_ops() may be called from any thread.
//
// Example:
//   for (const auto& op : fulgur::xla::lowered_ops())
//     std::cout << op.kind << " " << op.family << " " << op.test << "\n";

#include <string>
#include <vector>

namespace fulgur::xla {

struct LoweredOp {
  std::string kind;    // "aten::convolution"
  std::string family;  // "conv"
  std::string test;    // "StableHlo.ConvolutionAndItsBackward": gtest's Suite.Name in test_xla_rules
  // The platforms with a variant of the rule, tried before it where the plugin is theirs
  // ("host_kernels", "xla_cpu"); empty for most kinds.
  std::vector<std::string> platforms;
};

// Every lowered op kind, sorted by kind.
std::vector<LoweredOp> lowered_ops();

}  // namespace fulgur::xla
