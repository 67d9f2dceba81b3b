// SPDX-License-Identifier: Apache-2.0
#pragma once
// Lowering rules: what a rule sees (LoweringContext) and the table that maps an op kind to its
// rule. A rule is one function, `void rule(LoweringContext& cx, const Node* n)`, that reads the
// node's operands and arguments through `cx`, writes ops with the builder `cx` is, and gives each
// output its value with cx.set(n, i, value) (checked against the type the graph declares). It
// throws Unsupported for an argument it does not handle (the graph then falls back, the reason
// recorded). Each op family registers its rules in its own file, src/xla/stablehlo/rules/
// <family>.cpp, with add_<family>_rules(table); rules() holds every family's. A kind may also
// have platform rules (add_platform): variants for one plugin, chosen by EmitOptions, tried
// before the generic rule, instead of ifs inside it. The emitter's driver (emitter.cpp) walks the
// graph and calls the rules of each live node. Private to the emitter.
//
// Example (a rule and its row, as rules/elementwise.cpp writes neg):
//   void neg(LoweringContext& cx, const Node* n) {
//     cx.set(n, 0, cx.unary("stablehlo.negate", cx.as(cx.in(n, 0), cx.out_dtype(n))));
//   }
//   void add_elementwise_rules(RuleTable& table) {
//     table.add("aten::neg", neg, "XlaOps.UnaryMathAndItsBackwards");
//   }
// The third column names the per-op test against eager (tests/xla_rules/test_<family>.cpp) that
// covers the kind: the rule-table test fails for a row whose test does not exist, and
// fulgur-xla-ops lists the rows (fulgur::xla::lowered_ops()).

#include "xla/stablehlo/builder.h"
#include "xla/stablehlo/emitter.h"

#include <torch/csrc/jit/ir/ir.h>

#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace fulgur::xla::stablehlo {

using torch::jit::Node;
using torch::jit::Value;

class LoweringContext : public Builder {
 public:
  LoweringContext(const torch::jit::Graph& graph, const EmitOptions& options) : graph_(graph), options_(options) {}

  const EmitOptions& options() const { return options_; }
  const torch::jit::Graph& graph() const { return graph_; }

  // The value of input `i` of `n`. Throws Unsupported for one that is not a tensor or number
  // (a tensor constant, a list).
  const Operand& in(const Node* n, size_t i) const;
  // Output `i` of `n` is `x`. Throws std::logic_error if x's dims or dtype are not the ones the
  // graph declares (a rule's bug).
  void set(const Node* n, size_t i, Operand x);
  // `v` is `x`, unchecked: a number made from a 0-d tensor, or an input updated in place.
  void set_value(const Value* v, Operand x) { values_[v] = std::move(x); }
  // The dtype and sizes the graph declares for output `i` of `n`; std::invalid_argument if none.
  static c10::ScalarType out_dtype(const Node* n, size_t i = 0);
  static Dims out_dims(const Node* n, size_t i = 0);
  // Constant argument `i` of `n`; Unsupported ("non-constant <what>") if it is not a constant.
  static c10::IValue constant(const Node* n, size_t i, const char* what);
  static int64_t int_arg(const Node* n, size_t i, const char* what) { return constant(n, i, what).toInt(); }
  static bool bool_arg(const Node* n, size_t i, const char* what) { return constant(n, i, what).toBool(); }
  static bool none_arg(const Node* n, size_t i) { return n->input(i)->type()->kind() == c10::TypeKind::NoneType; }
  static Dims ints_arg(const Node* n, size_t i, const char* what) { return constant(n, i, what).toIntVector(); }
  // The dims a reduction's dim argument names (all of them for None or []), wrapped and sorted.
  static Dims reduced_dims(const Node* n, size_t i, size_t rank);
  // The window arguments of a convolution or a pooling, one per spatial dim (a single value
  // repeated, `if_empty` for []); std::invalid_argument for another length.
  static Dims spatial_arg(const Node* n, size_t i, const char* what, size_t spatial, const Dims& if_empty);
  // Argument `i` of `n` as a number known when the graph is emitted: a constant, or a value a
  // rule made from one (aten::IntImplicit of a constant tensor). Unsupported otherwise.
  c10::Scalar known_number(const Node* n, size_t i, const char* what) const;

  // `v` is `updated` for the rest of the graph: an op wrote it in place (the TorchScript graph
  // writes into the tensor). A graph input so updated becomes an extra result of @main
  // (Emission::updated_inputs).
  void update_input(const Value* v, Operand updated);

  // The tensors of a prim::ListConstruct value (cat's and stack's operand), or nullptr.
  const std::vector<Operand>* list(const Value* v) const {
    const auto it = lists_.find(v);
    return it == lists_.end() ? nullptr : &it->second;
  }
  void set_list(const Value* v, std::vector<Operand> elements) { lists_[v] = std::move(elements); }

  // Whether a live node (or the graph's return) uses `v`.
  bool used(const Value* v) const;

 protected:
  const torch::jit::Graph& graph_;
  const EmitOptions options_;
  std::unordered_set<const Node*> live_;  // the nodes the graph's outputs depend on
  std::unordered_map<const Value*, Operand> values_;
  // The elements of each live prim::ListConstruct of tensors.
  std::unordered_map<const Value*, std::vector<Operand>> lists_;
  // Graph inputs an op updated in place (their value in values_ is the updated one).
  std::vector<size_t> updated_inputs_;
};

using Rule = void (*)(LoweringContext& cx, const Node* n);

// One row of the table: an op kind, its rule, the family that registered it ("elementwise") and
// its per-op test ("XlaOps.UnaryMathAndItsBackwards").
struct RuleRow {
  std::string kind;
  Rule rule;
  std::string family;
  std::string test;
};

// The plugins with variants of some rules (JAX's lowerings registered for one platform), each
// on when the EmitOptions flag beside it is.
enum class Platform {
  host_kernels,  // EmitOptions::host_convolutions: libtorch's kernels as custom calls
  xla_cpu,       // EmitOptions::xla_cpu: forms XLA:CPU runs faster than the generic ones
};

// Whether `options` turn on the rules of `platform`.
bool platform_on(const EmitOptions& options, Platform platform);

// A platform rule: lowers `n` as a rule does and returns true, or returns false, having written
// nothing, for a node it does not take (the kind's generic rule then lowers it).
using PlatformRule = bool (*)(LoweringContext& cx, const Node* n);

struct PlatformVariant {
  Platform platform;
  PlatformRule rule;
};

class RuleTable {
 public:
  // The family that the rows added from now on belong to (rules() sets it before each
  // add_<family>_rules).
  void begin_family(const std::string& family) { family_ = family; }
  // Registers `rule` for `kind` ("aten::tanh"), covered by per-op test `test` ("Suite.Name").
  // Throws std::logic_error if `kind` has one, or for an empty test name.
  void add(const std::string& kind, Rule rule, const std::string& test);
  // The rule of `kind`, or nullptr.
  Rule find(const std::string& kind) const;
  // Every kind with a rule, sorted.
  std::vector<std::string> kinds() const;
  // Every row, sorted by kind.
  std::vector<RuleRow> rows() const;
  // Registers a platform variant of `kind`'s rule, tried (in the order added) before the
  // generic rule when `platform` is on. Throws std::logic_error if `kind` has no generic rule
  // yet (every kind lowers on every platform).
  void add_platform(const std::string& kind, Platform platform, PlatformRule rule);
  // The platform variants of `kind`, in the order added (empty for most kinds).
  const std::vector<PlatformVariant>& platform_rules(const std::string& kind) const;

 private:
  std::unordered_map<std::string, RuleRow> rules_;
  std::unordered_map<std::string, std::vector<PlatformVariant>> platform_rules_;
  std::string family_;
};

// The families' registrations, one file each under rules/.
void add_elementwise_rules(RuleTable& table);
void add_linalg_rules(RuleTable& table);
void add_reduce_rules(RuleTable& table);
void add_shape_rules(RuleTable& table);
void add_index_rules(RuleTable& table);
void add_loss_rules(RuleTable& table);
void add_conv_rules(RuleTable& table);
void add_norm_rules(RuleTable& table);
void add_softmax_loss_rules(RuleTable& table);
void add_pool_rules(RuleTable& table);
void add_upsample_rules(RuleTable& table);
void add_random_rules(RuleTable& table);

// Every family's rules; built once, then only read (thread-safe).
const RuleTable& rules();

}  // namespace fulgur::xla::stablehlo
