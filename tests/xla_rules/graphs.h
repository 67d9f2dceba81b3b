// SPDX-License-Identifier: Apache-2.0
#pragma once
// What the per-op tests of emitted graphs share (tests/xla_rules/test_<family>.cpp, the
// StableHlo suite): TorchScript graphs in the form the lazy TorchScript lowering makes, typed by
// running them node by node with eager libtorch (as the lazy backend types them from its nodes'
// shapes), emitted, compiled and run by the real CPU plugin, and compared with libtorch's
// results.
//
// NaN must come out where libtorch's results have NaN (a mean over ignored targets only, addmm
// of a NaN self with a nonzero beta). Tolerances: float32 results within 1e-5 relative + 1e-6
// absolute (XLA fuses multiply-adds and sums in another order than libtorch), whole steps
// included; gelu's tanh form 5e-6 absolute (XLA's tanh); convolution gradients 1e-4 relative +
// 5e-5 absolute (sums of thousands of products), and 1e-12 in float64; integer and bool
// results exactly.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/ir/irparser.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "support.h"
#include "xla/host_kernels.h"
#include "xla/pjrt/client.h"
#include "xla/pjrt/metrics.h"
#include "xla/pjrt/tensors.h"
#include "xla/pjrt_backend.h"
#include "xla/stablehlo/emitter.h"
#include "xla_rules/tolerance.h"

namespace pjrt = fulgur::xla::pjrt;
using c10::IValue;
using fulgur::xla::stablehlo::Alias;
using fulgur::xla::stablehlo::Emission;
using fulgur::xla::stablehlo::emit_stablehlo;
using torch::jit::Graph;

namespace xla_rules {

// parseIR reads neither True/False nor a bool list, and makes `[]` something else than a list:
// a `bool[]` constant is written as ints ([1, 0, 1]) and made a bool list here, and an empty
// `int[]` an empty int list, as the lazy lowering makes them.
inline std::shared_ptr<Graph> parse(const std::string& ir) {
  auto graph = std::make_shared<Graph>();
  torch::jit::parseIR(ir, graph.get());
  for (torch::jit::Node* n : graph->nodes()) {
    if (n->kind() == c10::prim::Constant && *n->output()->type() == *c10::ListType::ofInts() &&
        n->kindOf(c10::attr::value) == torch::jit::AttributeKind::ival && !n->ival(c10::attr::value).isList()) {
      n->removeAttribute(c10::attr::value);
      n->ival_(c10::attr::value, c10::List<int64_t>());
      continue;
    }
    if (n->kind() != c10::prim::Constant || *n->output()->type() != *c10::ListType::ofBools()) continue;
    c10::List<bool> bools;
    for (const IValue& x : torch::jit::toIValue(n->output())->toListRef()) bools.push_back(x.toInt() != 0);
    n->removeAttribute(c10::attr::value);
    n->ival_(c10::attr::value, bools);
  }
  return graph;
}

// Runs `graph` on `inputs` one node at a time with eager libtorch, gives every tensor value the
// type of its result (sizes and dtype) and returns the graph's outputs.
inline std::vector<IValue> run_eager_and_type(Graph& graph, const std::vector<IValue>& inputs) {
  std::unordered_map<const torch::jit::Value*, IValue> env;
  auto type = [](torch::jit::Value* v, const IValue& x) {
    if (x.isTensor() && x.toTensor().defined())
      v->setType(c10::TensorType::createContiguous(x.toTensor().scalar_type(), c10::kCPU, x.toTensor().sizes()));
  };
  for (size_t i = 0; i < inputs.size(); ++i) env[graph.inputs()[i]] = inputs[i];
  for (torch::jit::Node* n : graph.nodes()) {
    if (n->kind() == c10::prim::Constant) {
      env[n->output()] = *torch::jit::toIValue(n->output());
      continue;
    }
    if (n->kind() == c10::prim::ListConstruct) {  // likewise an instruction of the interpreter
      c10::List<at::Tensor> elements;
      for (const torch::jit::Value* v : n->inputs()) elements.push_back(env.at(v).toTensor());
      env[n->output()] = elements;
      continue;
    }
    if (n->kind() == c10::prim::TupleConstruct) {  // the interpreter's own instruction, no operator
      std::vector<IValue> elements;
      for (const torch::jit::Value* v : n->inputs()) elements.push_back(env.at(v));
      env[n->output()] = c10::ivalue::Tuple::create(std::move(elements));
      continue;
    }
    torch::jit::Operation operation = n->getOperation();
    torch::jit::Stack stack;
    for (const torch::jit::Value* v : n->inputs()) stack.push_back(env.at(v));
    operation(stack);
    for (size_t i = 0; i < n->outputs().size(); ++i) env[n->output(i)] = stack[i];
  }
  for (size_t i = 0; i < inputs.size(); ++i) type(graph.inputs()[i], inputs[i]);
  for (torch::jit::Node* n : graph.nodes())
    for (torch::jit::Value* v : n->outputs()) type(v, env.at(v));
  std::vector<IValue> outputs;
  for (const torch::jit::Value* v : graph.outputs()) outputs.push_back(env.at(v));
  return outputs;
}

// Emits `graph`, compiles it on the process's client and runs it on `inputs` (numbers go up as
// 0-d int64, float64 and bool tensors).
inline std::vector<torch::Tensor> run_on_pjrt(const Graph& graph, const std::vector<IValue>& inputs,
                                       const fulgur::xla::stablehlo::EmitOptions& options = {}) {
  const Emission emission = emit_stablehlo(graph, options);
  EXPECT_EQ(emission.unsupported, std::vector<std::string>{});
  if (!emission.unsupported.empty()) return {};
  const pjrt::Client& client = pjrt::process_client();
  pjrt::Executable exe = [&] {
    try {
      return client.compile(emission.module);
    } catch (const std::exception& e) {
      ADD_FAILURE() << e.what() << "\n" << emission.module;
      throw;
    }
  }();
  std::vector<pjrt::Buffer> args;
  for (const IValue& x : inputs) {
    const torch::Tensor t = x.isTensor() ? x.toTensor()
                            : x.isInt()  ? torch::scalar_tensor(x.toInt(), torch::kLong)
                            : x.isDouble() ? torch::scalar_tensor(x.toDouble(), torch::kDouble)
                                           : torch::scalar_tensor(x.toBool(), torch::kBool);
    args.push_back(pjrt::to_device(client, t));
  }
  std::vector<const pjrt::Buffer*> arg_ptrs;
  for (const pjrt::Buffer& b : args) arg_ptrs.push_back(&b);
  std::vector<torch::Tensor> outputs;
  for (const pjrt::Buffer& b : exe.execute(arg_ptrs)) outputs.push_back(pjrt::to_tensor(b));
  return outputs;
}

inline constexpr bool kNanEqualsNan = true;

inline void expect_same(const std::vector<torch::Tensor>& got, const std::vector<IValue>& want, const Tolerance& tol,
                 const std::string& label) {
  ASSERT_EQ(got.size(), want.size()) << label;
  for (size_t i = 0; i < got.size(); ++i) {
    const torch::Tensor w = want[i].toTensor();
    EXPECT_EQ(got[i].scalar_type(), w.scalar_type()) << label << " output " << i;
    EXPECT_EQ(got[i].sizes(), w.sizes()) << label << " output " << i;
    if (got[i].sizes() != w.sizes() || got[i].scalar_type() != w.scalar_type()) continue;
    if (w.is_floating_point()) {
      EXPECT_TRUE(torch::allclose(got[i], w, tol.rtol, tol.atol, kNanEqualsNan))
          << label << " output " << i << ": largest difference " << (got[i] - w).abs().max().item<double>()
          << ", largest relative difference " << ((got[i] - w).abs() / w.abs()).max().item<double>()
          << (w.numel() <= 64 ? "\ngot\n" + c10::str(got[i]) + "\nwant\n" + c10::str(w) : "");
    } else {
      EXPECT_TRUE(torch::equal(got[i], w)) << label << " output " << i << "\ngot\n" << got[i] << "\nwant\n" << w;
    }
  }
}

// Parses `ir`, types it on `inputs`, and checks the plugin's results against eager libtorch's.
inline void check(const std::string& ir, const std::vector<IValue>& inputs, const std::string& label,
           const Tolerance& tol = {}, const fulgur::xla::stablehlo::EmitOptions& options = {}) {
  SCOPED_TRACE(label);
  const auto graph = parse(ir);
  const std::vector<IValue> want = run_eager_and_type(*graph, inputs);
  expect_same(run_on_pjrt(*graph, inputs, options), want, tol, label);
}

inline torch::Tensor targets(int64_t n, int64_t classes, int64_t ignored_every) {
  torch::Tensor t = torch::randint(classes, {n}, torch::kLong);
  for (int64_t i = 0; i < n; i += ignored_every) t[i] = -100;
  return t;
}

inline std::string read_graph_file(const std::string& name) {
  std::ifstream in(std::string(FULGUR_TEST_GRAPHS) + "/" + name);
  EXPECT_TRUE(in) << "cannot read " << FULGUR_TEST_GRAPHS << "/" << name;
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Inputs for a lazy step's TorchScript graph. Its parameters are the distinct device data of
// the lazy IR dump beside it (`<step>.ir.txt`; the lowering gives one parameter to data used
// twice), whose dtypes and sizes that dump gives: the TorchScript graph's aten nodes are the
// IR's in the same order, with the same non-constant operands, so each parameter is matched to
// the device_data node it stands for through the first node using it. Ints are `ints` (alpha,
// beta, relu thresholds), floats and float64 0-d tensors in [0.5, 1) (Adam's factors), int64
// tensors tokens in [0, 10) if an embedding uses them and else class targets in [0, 10) (every
// 7th ignored: -100), float32 tensors normal (matrices divided by the square root of their
// fan-in).
inline std::vector<IValue> step_inputs(const std::string& step, const Graph& graph, int64_t ints) {
  struct IrNode {
    std::string kind;
    std::vector<std::pair<std::string, std::vector<int64_t>>> types;  // dtype, sizes per output
    std::vector<std::pair<int, int>> operands;                        // node id, output
  };
  std::unordered_map<int, IrNode> ir;
  std::vector<int> order;  // ids of the non-device_data nodes
  const std::regex line(R"(^\s*%(\d+) = \[(.*)\] ([\w:]+)\(([^)]*)\))");
  const std::regex type(R"((\w+)\[([0-9,]*)\])"), operand(R"(%(\d+)(?:\.(\d+))?)");
  std::stringstream text(read_graph_file(step + ".ir.txt"));
  for (std::string l; std::getline(text, l);) {
    std::smatch m;
    if (!std::regex_search(l, m, line)) continue;
    IrNode node{m[3], {}, {}};
    const std::string types = m[2], operands = m[4];
    for (auto it = std::sregex_iterator(types.begin(), types.end(), type); it != std::sregex_iterator(); ++it) {
      std::vector<int64_t> sizes;
      std::stringstream dims((*it)[2]);
      for (std::string d; std::getline(dims, d, ',');) sizes.push_back(std::stoll(d));
      node.types.emplace_back((*it)[1], sizes);
    }
    for (auto it = std::sregex_iterator(operands.begin(), operands.end(), operand); it != std::sregex_iterator(); ++it)
      node.operands.emplace_back(std::stoi((*it)[1]), (*it)[2].matched ? std::stoi((*it)[2]) : 0);
    const int id = std::stoi(m[1]);
    if (node.kind != "lazy_tensors::device_data") order.push_back(id);
    ir[id] = std::move(node);
  }
  // graph input -> its device_data node's id and the kind of its first user
  std::unordered_map<const torch::jit::Value*, std::pair<int, std::string>> param_data;
  size_t next = 0;
  for (const torch::jit::Node* n : graph.nodes()) {
    if (n->kind() == c10::prim::Constant || n->kind() == c10::prim::TupleConstruct) continue;
    if (next >= order.size()) {
      ADD_FAILURE() << step << ": more aten nodes in the TorchScript graph than in the IR";
      return {};
    }
    const IrNode& node = ir.at(order[next++]);
    std::vector<const torch::jit::Value*> operands;
    for (const torch::jit::Value* v : n->inputs())
      if (v->node()->kind() != c10::prim::Constant) operands.push_back(v);
    if (node.kind != n->kind().toQualString() || operands.size() != node.operands.size()) {
      ADD_FAILURE() << step << ": TorchScript node " << *n << " does not match IR node " << node.kind;
      return {};
    }
    for (size_t i = 0; i < operands.size(); ++i)
      if (operands[i]->node() == graph.param_node())
        param_data.emplace(operands[i], std::make_pair(node.operands[i].first, node.kind));
  }
  std::vector<IValue> inputs;
  for (const torch::jit::Value* v : graph.inputs()) {
    const auto it = param_data.find(v);
    if (it == param_data.end()) {
      ADD_FAILURE() << step << ": parameter %" << v->debugName() << " is used by no aten node";
      return {};
    }
    const auto& [dtype, sizes] = ir.at(it->second.first).types.at(0);
    if (v->type()->kind() == c10::TypeKind::IntType) {
      inputs.emplace_back(ints);
    } else if (v->type()->kind() == c10::TypeKind::FloatType) {
      inputs.emplace_back(0.5 + 0.5 * torch::rand({}).item<double>());
    } else if (dtype == "Double") {
      inputs.emplace_back(torch::rand(sizes, torch::kDouble) * 0.5 + 0.5);
    } else if (dtype == "Long") {
      const bool tokens = it->second.second == "aten::embedding";
      inputs.emplace_back(tokens ? torch::randint(10, sizes, torch::kLong)
                                 : targets(c10::multiply_integers(sizes), 10, 7).reshape(sizes));
    } else {
      EXPECT_EQ(dtype, "Float") << step;
      // Weights as nn.Linear draws them (std 1/sqrt(fan_in)), so activations keep their size.
      inputs.emplace_back(sizes.size() == 2 ? torch::randn(sizes) / std::sqrt(static_cast<double>(sizes[1]))
                                            : torch::randn(sizes));
    }
  }
  return inputs;
}

// A step's TorchScript graph; its NamedTuple types (which parseIR does not read) as tuples.
// True/False in bool[] constants as 1/0 and annotate(List[int], []) as [] (see parse()).
inline std::shared_ptr<Graph> step_graph(const std::string& step) {
  std::string text = std::regex_replace(read_graph_file(step + ".ts.txt"), std::regex(R"(NamedTuple\([^)]*\))"),
                                        "(Tensor, Tensor)");
  text = std::regex_replace(std::regex_replace(text, std::regex(R"(\bTrue\b)"), "1"), std::regex(R"(\bFalse\b)"), "0");
  text = std::regex_replace(text, std::regex(R"(annotate\(List\[int\], \[\]\))"), "[]");
  return parse(text);
}

// Emits a whole step's graph and compares every output with the TorchScript interpreter's.
inline void check_step(const std::string& step, const std::shared_ptr<Graph>& graph, const std::vector<IValue>& inputs,
                const Tolerance& tol) {
  SCOPED_TRACE(step);
  torch::jit::GraphExecutor interpreter(graph->copy(), step);
  torch::jit::Stack stack = inputs;
  interpreter.run(stack);
  run_eager_and_type(*graph, inputs);
  const double compile_before = pjrt::runtime_metrics().compile_seconds;
  const std::vector<torch::Tensor> got = run_on_pjrt(*graph, inputs);
  expect_same(got, stack, tol, step);
  double largest = 0;
  for (size_t i = 0; i < got.size() && i < stack.size(); ++i)
    if (got[i].is_floating_point() && got[i].sizes() == stack[i].toTensor().sizes())
      largest = std::max(largest, ((got[i] - stack[i].toTensor()).abs() / (stack[i].toTensor().abs() + 1e-3))
                                      .max()
                                      .item<double>());
  std::printf("%s: %zu outputs, compiled in %.0f ms, largest |got - want| / (|want| + 1e-3) %.2g\n", step.c_str(),
              got.size(), (pjrt::runtime_metrics().compile_seconds - compile_before) * 1e3, largest);
}

}  // namespace xla_rules
