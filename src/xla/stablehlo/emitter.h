// SPDX-License-Identifier: Apache-2.0
#pragma once
// StableHLO text from a typed TorchScript graph: the graphs libtorch's lazy TorchScript lowering
// makes (plain aten ops, attributes as prim::Constant inputs in schema order), turned into a
// program the PJRT runtime (xla/pjrt/client.h) compiles with format "mlir".
//
// The graph must be typed: every graph input and every output of a live node carries a
// TensorType with concrete sizes and a scalar type, or is an int, float or bool (a 0-d number).
// Each op follows PyTorch's semantics: the result has the output's declared dtype and every
// operand is converted to it (0-d tensors and numbers included, as libtorch's CPU kernels
// convert a scalar operand to the op's type); comparisons compare in the promoted type of their
// operands (torch.result_type's rules: dimensioned tensors, then 0-d tensors, then numbers);
// operands broadcast as in NumPy; `alpha` and `beta` scale as in add, sub and addmm.
//
// Only nodes that the graph's outputs depend on are lowered: dead constants and the
// prim::TupleConstruct nodes of the lazy lowering are ignored.
//
// Ops are written in MLIR's generic form ("stablehlo.add"(%a, %b) : (...) -> ...), which changes
// least across StableHLO versions; the text is tested against the pinned CPU plugin
// (StableHLO 1.13.3) only.
//
// Thread safety: a pure function of the graph; the graph is only read.
//
// Example:
//   auto graph = std::make_shared<torch::jit::Graph>();
//   torch::jit::parseIR("graph(%a : Float(2, 3), %b : Float(3)):\n"
//                       "  %c : Float(2, 3) = aten::mul(%a, %b)\n  return (%c)\n", graph.get());
//   Emission e = emit_stablehlo(*graph);
//   if (e.unsupported.empty()) client.compile(e.module);

#include <string>
#include <vector>

namespace torch::jit {
struct Graph;
}

namespace fulgur::xla::stablehlo {

// A graph input whose buffer one of @main's results may take over (the lazy core's
// input/output aliases: a parameter the step updates, whose old value nothing reads after it).
struct Alias {
  size_t input;   // graph input
  size_t result;  // index into @main's results: an output, or an updated input after them
  bool operator==(const Alias& o) const { return input == o.input && result == o.result; }
};

struct Emission {
  // A module with one function @main whose parameters are the graph's inputs in order (an int
  // input is a tensor<i64>, a float one a tensor<f64>, a bool one a tensor<i1>) and whose
  // results are the graph's outputs in order. Empty if `unsupported` is not.
  std::string module;
  // Graph inputs the graph updates in place (aten::native_batch_norm in training writes its
  // running_mean and running_var, as libtorch's kernel and the TorchScript interpreter do), in
  // the order of the extra results @main returns after the graph's outputs: result
  // graph.outputs().size() + j is the new value of graph input updated_inputs[j].
  std::vector<size_t> updated_inputs;
  // The aliases @main declares (`tf.aliasing_output = result` on the input), in input order:
  // those asked for whose input and result have the same type and whose input one op reads (an
  // optimizer's state, not a weight the step also reads), the first for each input and each
  // result. The runtime may then let the result take over the argument's buffer (donation).
  std::vector<Alias> aliases;
  // What the emitter cannot lower, in graph order, each entry once: the kind of each live node
  // it does not know ("aten::convolution_backward"), or a known kind with the argument it does
  // not handle ("aten::div (rounding_mode 'floor')"). The caller falls back to another backend
  // for the graph.
  std::vector<std::string> unsupported;
};

struct EmitOptions {
  // Float32 and float64 convolutions and their gradients call libtorch's CPU kernels
  // (xla/host_kernels.h) through stablehlo.custom_call instead of being stablehlo.convolution
  // ops. Only for a plugin that has those kernels registered (the CPU plugin).
  bool host_convolutions = false;
  // The plugin is XLA:CPU: its platform rules replace the generic lowering where they apply (a
  // convolution of one input feature as a sum of shifted windows, a float32 max pool as one
  // reduce_window over packed value-index keys), forms XLA:CPU runs faster.
  bool xla_cpu = false;
};

// REQUIRES: `graph` is typed as above. Throws std::invalid_argument naming the value for a
// graph that is not (a live value without a concrete type, an output that is not a tensor or
// number).
Emission emit_stablehlo(const torch::jit::Graph& graph, const EmitOptions& options = {},
                        const std::vector<Alias>& aliases = {});

// The graph inputs that ops of `graph` update in place when the TorchScript interpreter runs it
// (Emission::updated_inputs' rule, for a graph that runs there), ascending.
std::vector<size_t> inputs_updated_in_place(const torch::jit::Graph& graph);

}  // namespace fulgur::xla::stablehlo
