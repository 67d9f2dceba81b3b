// SPDX-License-Identifier: Apache-2.0
// The lowering context and the rule table; see lowering.h.

#include "xla/stablehlo/lowering.h"

#include <fulgur/xla/ops.h>

#include <torch/csrc/jit/ir/constants.h>

#include <algorithm>
#include <stdexcept>

namespace fulgur::xla::stablehlo {

const Operand& LoweringContext::in(const Node* n, size_t i) const {
  const auto it = values_.find(n->input(i));
  if (it == values_.end())  // a tensor or list constant, or a node's output of another type
    throw Unsupported{"operand " + std::to_string(i) + " of type " + n->input(i)->type()->repr_str()};
  return it->second;
}

void LoweringContext::set(const Node* n, size_t i, Operand x) {
  const Dims dims = out_dims(n, i);
  const c10::ScalarType t = out_dtype(n, i);
  if (x.dims != dims || x.dtype != t)
    throw std::logic_error(std::string("lowering of ") + n->kind().toQualString() + " made " +
                           mlir_type(x.dims, x.dtype) + " for %" + n->output(i)->debugName() + " declared " +
                           mlir_type(dims, t));
  values_[n->output(i)] = std::move(x);
}

c10::ScalarType LoweringContext::out_dtype(const Node* n, size_t i) {
  const auto tensor = n->output(i)->type()->cast<c10::TensorType>();
  if (!tensor || !tensor->scalarType())
    throw std::invalid_argument("output %" + n->output(i)->debugName() + " of " + n->kind().toQualString() +
                                " has no scalar type (type " + n->output(i)->type()->repr_str() +
                                "): the emitter needs a typed graph");
  return *tensor->scalarType();
}

Dims LoweringContext::out_dims(const Node* n, size_t i) {
  const auto tensor = n->output(i)->type()->cast<c10::TensorType>();
  const auto sizes = tensor ? tensor->sizes().concrete_sizes() : c10::nullopt;
  if (!sizes)
    throw std::invalid_argument("output %" + n->output(i)->debugName() + " of " + n->kind().toQualString() +
                                " has no concrete sizes (type " + n->output(i)->type()->repr_str() +
                                "): the emitter needs a typed graph");
  return *sizes;
}

c10::IValue LoweringContext::constant(const Node* n, size_t i, const char* what) {
  const auto value = torch::jit::toIValue(n->input(i));
  if (!value) throw Unsupported{std::string("non-constant ") + what};
  return *value;
}

Dims LoweringContext::reduced_dims(const Node* n, size_t i, size_t rank) {
  Dims dims;
  if (!none_arg(n, i)) dims = ints_arg(n, i, "dim");
  if (dims.empty())
    for (size_t d = 0; d < rank; ++d) dims.push_back(static_cast<int64_t>(d));
  for (int64_t& d : dims) d = wrap_dim(d, rank);
  std::sort(dims.begin(), dims.end());
  dims.erase(std::unique(dims.begin(), dims.end()), dims.end());
  if (rank == 0) dims.clear();
  return dims;
}

Dims LoweringContext::spatial_arg(const Node* n, size_t i, const char* what, size_t spatial, const Dims& if_empty) {
  Dims v = ints_arg(n, i, what);
  if (v.empty()) v = if_empty;
  if (v.size() == 1) v.assign(spatial, v[0]);
  if (v.size() != spatial) throw std::invalid_argument(std::string(what) + " of another length than the spatial dims");
  return v;
}

c10::Scalar LoweringContext::known_number(const Node* n, size_t i, const char* what) const {
  if (const auto value = torch::jit::toIValue(n->input(i))) {
    if (value->isInt() || value->isDouble() || value->isBool()) return value->toScalar();
  }
  const auto it = values_.find(n->input(i));
  if (it == values_.end() || !it->second.constant) throw Unsupported{std::string("non-constant ") + what};
  return *it->second.constant;
}

void LoweringContext::update_input(const Value* v, Operand updated) {
  if (v->node() == graph_.param_node() &&
      std::find(updated_inputs_.begin(), updated_inputs_.end(), v->offset()) == updated_inputs_.end())
    updated_inputs_.push_back(v->offset());
  values_[v] = std::move(updated);
}

bool LoweringContext::used(const Value* v) const {
  return std::any_of(v->uses().begin(), v->uses().end(), [&](const torch::jit::Use& u) {
    return u.user == graph_.return_node() || live_.count(u.user) > 0;
  });
}

void RuleTable::add(const std::string& kind, Rule rule, const std::string& test) {
  if (test.empty()) throw std::logic_error("the lowering rule of " + kind + " names no per-op test");
  if (!rules_.emplace(kind, RuleRow{kind, rule, family_, test}).second)
    throw std::logic_error("two lowering rules for " + kind);
}

Rule RuleTable::find(const std::string& kind) const {
  const auto it = rules_.find(kind);
  return it == rules_.end() ? nullptr : it->second.rule;
}

std::vector<std::string> RuleTable::kinds() const {
  std::vector<std::string> out;
  for (const auto& [kind, row] : rules_) out.push_back(kind);
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<RuleRow> RuleTable::rows() const {
  std::vector<RuleRow> out;
  for (const auto& [kind, row] : rules_) out.push_back(row);
  std::sort(out.begin(), out.end(), [](const RuleRow& a, const RuleRow& b) { return a.kind < b.kind; });
  return out;
}

bool platform_on(const EmitOptions& options, Platform platform) {
  switch (platform) {
    case Platform::host_kernels: return options.host_convolutions;
    case Platform::xla_cpu: return options.xla_cpu;
  }
  return false;
}

void RuleTable::add_platform(const std::string& kind, Platform platform, PlatformRule rule) {
  if (!rules_.count(kind)) throw std::logic_error("a platform rule for " + kind + ", which has no generic rule");
  platform_rules_[kind].push_back({platform, rule});
}

const std::vector<PlatformVariant>& RuleTable::platform_rules(const std::string& kind) const {
  static const std::vector<PlatformVariant> none;
  const auto it = platform_rules_.find(kind);
  return it == platform_rules_.end() ? none : it->second;
}

const RuleTable& rules() {
  static const RuleTable table = [] {
    const std::pair<const char*, void (*)(RuleTable&)> families[] = {
        {"elementwise", add_elementwise_rules}, {"linalg", add_linalg_rules},
        {"reduce", add_reduce_rules},           {"shape", add_shape_rules},
        {"index", add_index_rules},             {"loss", add_loss_rules},
        {"conv", add_conv_rules},               {"norm", add_norm_rules},
        {"softmax_loss", add_softmax_loss_rules}, {"pool", add_pool_rules},
        {"upsample", add_upsample_rules},       {"random", add_random_rules},
    };
    RuleTable t;
    for (const auto& [family, add] : families) {
      t.begin_family(family);
      add(t);
    }
    return t;
  }();
  return table;
}

}  // namespace fulgur::xla::stablehlo

namespace fulgur::xla {

std::vector<LoweredOp> lowered_ops() {
  std::vector<LoweredOp> out;
  for (const stablehlo::RuleRow& row : stablehlo::rules().rows()) {
    LoweredOp op{row.kind, row.family, row.test, {}};
    for (const stablehlo::PlatformVariant& v : stablehlo::rules().platform_rules(row.kind))
      op.platforms.push_back(v.platform == stablehlo::Platform::host_kernels ? "host_kernels" : "xla_cpu");
    out.push_back(std::move(op));
  }
  return out;
}

}  // namespace fulgur::xla
