// SPDX-License-Identifier: Apache-2.0
#pragma once
// The PJRT lazy backend's lowering and compile (pjrt_backend.h): the TorchScript lowering, typed
// from the lazy nodes' shapes and the parameters' data and with the aliases of the data an update
// replaces; then each graph emitted as StableHLO and compiled by the process's PJRT client, or
// kept on TorchScript when an op has no lowering.

#include <torch/csrc/lazy/backend/lowering_context.h>
#include <torch/csrc/lazy/core/ir.h>
#include <torch/csrc/lazy/ts_backend/ts_lowering_context.h>

#include <memory>
#include <string>
#include <vector>

#include "xla/pjrt/client.h"
#include "xla/stablehlo/emitter.h"

namespace fulgur::xla::detail {

namespace lazy = torch::lazy;

// A TorchScript computation that, when XLA compiled its graph, runs on PJRT instead.
class PjrtComputation : public lazy::TSComputation {
 public:
  PjrtComputation(const std::shared_ptr<torch::jit::Graph>& graph, std::shared_ptr<pjrt::Executable> exe,
                  std::vector<lazy::Shape> output_shapes, std::vector<size_t> updated_inputs,
                  std::vector<stablehlo::Alias> aliases = {}, std::vector<long> node_holds = {})
      : lazy::TSComputation(graph),
        executable(std::move(exe)),
        output_shapes(std::move(output_shapes)),
        updated_inputs(std::move(updated_inputs)),
        aliases(std::move(aliases)),
        node_holds(std::move(node_holds)) {}
  std::shared_ptr<pjrt::Executable> executable;  // null: run by TorchScript
  std::vector<lazy::Shape> output_shapes;          // of the graph's outputs, when run by XLA
  // Arguments the graph updates in place (stablehlo::Emission::updated_inputs); on XLA their new
  // values are the results after the graph's outputs.
  std::vector<size_t> updated_inputs;
  // Arguments whose buffers the executable may reuse for a result (stablehlo::Emission::aliases).
  std::vector<stablehlo::Alias> aliases;
  // Per argument, the device-data nodes of the graph that hold it: the lazy core keeps the graph's
  // IR alive while it runs the computation, so these hold an argument besides the parameter list.
  std::vector<long> node_holds;
};

// The lowering context of the backend's CreateLoweringContext: the TorchScript lowering of
// `post_order`, with every tensor value typed (its shape and dtype) for the emitter.
std::unique_ptr<lazy::LoweringContext> make_lowering_context(const std::string& name, lazy::BackendDevice device,
                                                             c10::ArrayRef<const lazy::Node*> post_order,
                                                             lazy::Util::EmissionMap emit_status);

// One computation of TorchScript's Compile (of a graph lowered by make_lowering_context) as a
// PjrtComputation: compiled by PJRT, or run by TorchScript when an op has no lowering (counted
// and warned about once per op). Throws what emit_then_compile throws.
std::shared_ptr<PjrtComputation> compile_computation(const lazy::ComputationPtr& instance);

}  // namespace fulgur::xla::detail
