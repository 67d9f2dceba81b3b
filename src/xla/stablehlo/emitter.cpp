// SPDX-License-Identifier: Apache-2.0
// The StableHLO emitter's driver; see emitter.h. Emitter::run walks the graph: it finds the live
// nodes, reports the kinds without a rule, gives the graph's inputs their parameters, calls each
// live node's lowering rule (the rule table of the op families in rules/, lowering.h: the first
// platform rule of the options' platforms that takes the node, else the generic rule) and writes
// @main with its results and aliases. emit_stablehlo first runs the graph passes (passes.h).

#include "xla/stablehlo/emitter.h"

#include "xla/stablehlo/lowering.h"
#include "xla/stablehlo/passes.h"

#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/ir/ir.h>

#include <algorithm>
#include <sstream>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

namespace fulgur::xla::stablehlo {
namespace {

class Emitter : public LoweringContext {
 public:
  Emitter(const torch::jit::Graph& graph, const EmitOptions& options, const std::vector<Alias>& aliases)
      : LoweringContext(graph, options), aliases_(aliases) {}

  Emission run();

 private:
  Operand operand_of_input(const Value* v);

  const std::vector<Alias> aliases_;  // asked for by the caller
};

Operand Emitter::operand_of_input(const Value* v) {
  const c10::TypePtr& type = v->type();
  if (const auto tensor = type->cast<c10::TensorType>()) {
    const auto sizes = tensor->sizes().concrete_sizes();
    if (!sizes || !tensor->scalarType())
      throw std::invalid_argument("graph input %" + v->debugName() + " has type " + type->repr_str() +
                                  ": the emitter needs concrete sizes and a scalar type");
    return {"", *sizes, *tensor->scalarType(), sizes->empty() ? Tier::zero_dim : Tier::dimensioned, std::nullopt};
  }
  switch (type->kind()) {
    case c10::TypeKind::IntType: return {"", {}, c10::kLong, Tier::number, std::nullopt};
    case c10::TypeKind::FloatType: return {"", {}, c10::kDouble, Tier::number, std::nullopt};
    case c10::TypeKind::BoolType: return {"", {}, c10::kBool, Tier::number, std::nullopt};
    default:
      throw Unsupported{"graph input %" + v->debugName() + " of type " + type->repr_str() +
                        " (the emitter takes tensors, ints, floats and bools)"};
  }
}

Emission Emitter::run() {
  std::unordered_set<const Node*>& live = live_;
  std::vector<const Value*> pending(graph_.outputs().begin(), graph_.outputs().end());
  while (!pending.empty()) {
    const Node* n = pending.back()->node();
    pending.pop_back();
    if (n == graph_.param_node() || !live.insert(n).second) continue;
    for (const Value* v : n->inputs()) pending.push_back(v);
  }

  Emission result;
  auto record = [&](const std::string& what) {
    if (std::find(result.unsupported.begin(), result.unsupported.end(), what) == result.unsupported.end())
      result.unsupported.push_back(what);
  };
  for (const Node* n : graph_.nodes()) {
    if (!live.count(n) || n->kind() == c10::prim::Constant) continue;
    const char* kind = n->kind().toQualString();
    if (!rules().find(kind)) record(kind);
  }
  if (!result.unsupported.empty()) return result;

  std::vector<std::string> input_types(graph_.inputs().size());
  for (size_t i = 0; i < graph_.inputs().size(); ++i) {
    const Value* v = graph_.inputs()[i];
    try {
      Operand x = operand_of_input(v);
      x.ssa = "%a" + std::to_string(i);
      input_types[i] = mlir_type(x.dims, x.dtype);
      values_[v] = std::move(x);
    } catch (const Unsupported& u) {
      record("graph input " + std::to_string(i) + " (" + u.what + ")");
    }
  }
  if (!result.unsupported.empty()) return result;

  std::unordered_set<const Value*> poisoned;  // outputs of nodes that could not be lowered
  for (const Node* n : graph_.nodes()) {
    if (!live.count(n)) continue;
    if (n->kind() == c10::prim::Constant) {
      const Value* v = n->output();
      const auto value = torch::jit::toIValue(v);
      if (value && (value->isInt() || value->isDouble() || value->isBool())) {
        const c10::ScalarType t = value->isInt() ? c10::kLong : value->isDouble() ? c10::kDouble : c10::kBool;
        values_[v] = Operand{"", {}, t, Tier::number, value->toScalar()};
      }
      continue;
    }
    if (std::any_of(n->inputs().begin(), n->inputs().end(), [&](const Value* v) { return poisoned.count(v) > 0; })) {
      for (const Value* v : n->outputs()) poisoned.insert(v);
      continue;
    }
    try {
      const char* kind = n->kind().toQualString();
      bool lowered = false;
      for (const PlatformVariant& v : rules().platform_rules(kind))
        if (!lowered && platform_on(options_, v.platform)) lowered = v.rule(*this, n);
      if (!lowered) rules().find(kind)(*this, n);
    } catch (const Unsupported& u) {
      record(std::string(n->kind().toQualString()) + " (" + u.what + ")");
      for (const Value* v : n->outputs()) poisoned.insert(v);
    } catch (const c10::Error& e) {
      // A constant argument of another type than the lowering reads (an overload it does not know).
      record(std::string(n->kind().toQualString()) + " (arguments " + e.what_without_backtrace() + ")");
      for (const Value* v : n->outputs()) poisoned.insert(v);
    }
  }
  if (!result.unsupported.empty()) return result;

  std::vector<Operand> outputs;
  for (const Value* v : graph_.outputs()) {
    const auto it = values_.find(v);
    if (it == values_.end())
      throw std::invalid_argument("graph output %" + v->debugName() + " (" + v->type()->repr_str() +
                                  ") is not a tensor or number the emitter made");
    outputs.push_back(materialized(it->second));
  }
  for (size_t k : updated_inputs_) outputs.push_back(materialized(values_.at(graph_.inputs()[k])));
  result.updated_inputs = updated_inputs_;
  std::vector<std::string> output_types;
  std::string types;  // of the results, comma-separated
  for (const Operand& o : outputs) {
    output_types.push_back(mlir_type(o.dims, o.dtype));
    types += (types.empty() ? "" : ", ") + output_types.back();
  }
  // The aliases asked for whose input and result have one type and whose input has one use,
  // the first of each input and result kept. An updated input is not aliased: its tensor keeps
  // holding the data, so it could never be donated, and the plugin would copy it each run.
  std::vector<int64_t> alias_of(input_types.size(), -1);
  std::vector<bool> result_taken(outputs.size(), false);
  for (const Alias& a : aliases_) {
    if (a.input >= input_types.size() || a.result >= outputs.size() || alias_of[a.input] >= 0 ||
        result_taken[a.result] || input_types[a.input] != output_types[a.result] ||
        std::find(updated_inputs_.begin(), updated_inputs_.end(), a.input) != updated_inputs_.end())
      continue;
    // Only an input that one op reads: XLA then writes the result over it in place. One the
    // graph reads elsewhere too (a weight, read by the forward and backward as well as by its
    // update) makes XLA order those reads first or copy it; on the MNIST CNN aliasing the
    // weights as well made the step 1.05x slower, the optimizer state alone 0.97x
    // (bench/history/libtorch-1.13.md).
    if (graph_.inputs()[a.input]->uses().size() != 1) continue;
    alias_of[a.input] = static_cast<int64_t>(a.result);
    result_taken[a.result] = true;
  }
  std::ostringstream signature;
  signature << "  func.func @main(";
  for (size_t i = 0; i < input_types.size(); ++i) {
    signature << (i ? ", " : "") << "%a" << i << ": " << input_types[i];
    if (alias_of[i] >= 0) {
      signature << " {tf.aliasing_output = " << alias_of[i] << " : i32}";
      result.aliases.push_back({i, static_cast<size_t>(alias_of[i])});
    }
  }
  signature << ") -> (" << types << ") {\n";

  std::ostringstream module;
  module << "module {\n" << signature.str() << body() << "    \"func.return\"(";
  for (size_t i = 0; i < outputs.size(); ++i) module << (i ? ", " : "") << outputs[i].ssa;
  module << ") : (" << types << ") -> ()\n  }\n}\n";
  result.module = module.str();
  return result;
}

}  // namespace

Emission emit_stablehlo(const torch::jit::Graph& graph, const EmitOptions& options, const std::vector<Alias>& aliases) {
  // The passes rewrite a copy, made only when one applies (the caller's graph may still run on
  // TorchScript).
  if (!has_threshold_after_tiled_pool(graph)) return Emitter(graph, options, aliases).run();
  // Graph::copy only reads the graph; libtorch does not mark it const.
  const std::shared_ptr<torch::jit::Graph> rewritten = const_cast<torch::jit::Graph&>(graph).copy();
  move_thresholds_before_tiled_pools(*rewritten);
  return Emitter(*rewritten, options, aliases).run();
}

std::vector<size_t> inputs_updated_in_place(const torch::jit::Graph& graph) {
  std::vector<size_t> out;
  for (const Node* n : graph.nodes()) {
    if (n->kind() != c10::Symbol::fromQualString("aten::native_batch_norm") || n->inputs().size() < 6) continue;
    const auto training = torch::jit::toIValue(n->input(5));
    if (!training || !training->isBool() || !training->toBool()) continue;
    for (size_t i : {3, 4}) {
      const Value* v = n->input(i);
      if (v->node() == graph.param_node() && v->type()->cast<c10::TensorType>()) out.push_back(v->offset());
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace fulgur::xla::stablehlo
