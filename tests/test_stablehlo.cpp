// SPDX-License-Identifier: Apache-2.0
// The StableHLO emitter (src/xla/stablehlo): TorchScript graphs in the form the lazy TorchScript
// lowering makes, typed by running them node by node with eager libtorch (as the lazy backend
// types them from its nodes' shapes), emitted, compiled and run by the real CPU plugin, and
// compared with libtorch's results.
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

namespace pjrt = fulgur::xla::pjrt;
using c10::IValue;
using fulgur::xla::stablehlo::Alias;
using fulgur::xla::stablehlo::Emission;
using fulgur::xla::stablehlo::emit_stablehlo;
using torch::jit::Graph;

namespace {

// parseIR reads neither True/False nor a bool list, and makes `[]` something else than a list:
// a `bool[]` constant is written as ints ([1, 0, 1]) and made a bool list here, and an empty
// `int[]` an empty int list, as the lazy lowering makes them.
std::shared_ptr<Graph> parse(const std::string& ir) {
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
std::vector<IValue> run_eager_and_type(Graph& graph, const std::vector<IValue>& inputs) {
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
std::vector<torch::Tensor> run_on_pjrt(const Graph& graph, const std::vector<IValue>& inputs,
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

struct Tolerance {
  double rtol = 1e-5;
  double atol = 1e-6;
};

constexpr bool kNanEqualsNan = true;

void expect_same(const std::vector<torch::Tensor>& got, const std::vector<IValue>& want, const Tolerance& tol,
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
void check(const std::string& ir, const std::vector<IValue>& inputs, const std::string& label,
           const Tolerance& tol = {}, const fulgur::xla::stablehlo::EmitOptions& options = {}) {
  SCOPED_TRACE(label);
  const auto graph = parse(ir);
  const std::vector<IValue> want = run_eager_and_type(*graph, inputs);
  expect_same(run_on_pjrt(*graph, inputs, options), want, tol, label);
}

torch::Tensor targets(int64_t n, int64_t classes, int64_t ignored_every) {
  torch::Tensor t = torch::randint(classes, {n}, torch::kLong);
  for (int64_t i = 0; i < n; i += ignored_every) t[i] = -100;
  return t;
}

std::string read_graph_file(const std::string& name) {
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
std::vector<IValue> step_inputs(const std::string& step, const Graph& graph, int64_t ints) {
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
std::shared_ptr<Graph> step_graph(const std::string& step) {
  std::string text = std::regex_replace(read_graph_file(step + ".ts.txt"), std::regex(R"(NamedTuple\([^)]*\))"),
                                        "(Tensor, Tensor)");
  text = std::regex_replace(std::regex_replace(text, std::regex(R"(\bTrue\b)"), "1"), std::regex(R"(\bFalse\b)"), "0");
  text = std::regex_replace(text, std::regex(R"(annotate\(List\[int\], \[\]\))"), "[]");
  return parse(text);
}

// Emits a whole step's graph and compares every output with the TorchScript interpreter's.
void check_step(const std::string& step, const std::shared_ptr<Graph>& graph, const std::vector<IValue>& inputs,
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

}  // namespace

TEST(StableHlo, ArithmeticBroadcastsAndConvertsScalarsAsLibtorch) {
  // add with an int alpha from the graph's inputs (as the lazy lowering passes it), sub with a
  // constant alpha, a float input and a 0-d float64 tensor as operands of float32 tensors.
  const std::string ir = R"IR(
graph(%a : Tensor, %b : Tensor, %s : Tensor, %alpha : int, %f : float):
  %c : float = prim::Constant[value=2.5]()
  %x : Tensor = aten::add(%a, %b, %alpha)
  %y : Tensor = aten::sub(%x, %s, %c)
  %z : Tensor = aten::mul(%y, %f)
  %w : Tensor = aten::div(%z, %b)
  %m : Tensor = aten::mul(%a, %s)
  %q : Tensor = aten::sqrt(%m)
  %u : Tensor = aten::addcmul(%a, %b, %b, %f)
  %v : Tensor = aten::addcdiv(%a, %b, %m, %alpha)
  return (%x, %y, %z, %w, %q, %u, %v)
)IR";
  torch::manual_seed(0);
  const auto s = torch::scalar_tensor(0.75, torch::kDouble);
  check(ir, {torch::rand({4, 5}) + 0.5, torch::rand({5}) + 0.5, s, int64_t{3}, 0.3}, "[4,5] with [5]");
  check(ir, {torch::rand({2, 3, 4}) + 0.5, torch::rand({3, 1}) + 0.5, s, int64_t{-2}, -1.5}, "[2,3,4] with [3,1]");
  check(ir, {torch::rand({3}) + 0.5, torch::rand({2, 3}) + 0.5, s, int64_t{1}, 2.0}, "[3] with [2,3]");
}

TEST(StableHlo, TypePromotionOfMixedOperands) {
  // int64 + float32 -> float32; int64 / int64 -> float32 (true division); int64 tensor * a
  // float number -> float32; int64 tensor + int number stays int64; sqrt of int64 -> float32.
  const std::string ir = R"IR(
graph(%i : Tensor, %j : Tensor, %f : Tensor, %n : int, %x : float):
  %one : int = prim::Constant[value=1]()
  %a : Tensor = aten::add(%i, %f, %one)
  %d : Tensor = aten::div(%i, %j)
  %m : Tensor = aten::mul(%i, %x)
  %k : Tensor = aten::add(%i, %n, %one)
  %r : Tensor = aten::sqrt(%j)
  %e : Tensor = aten::eq(%i, %f)
  %g : Tensor = aten::eq(%i, %n)
  return (%a, %d, %m, %k, %r, %e, %g)
)IR";
  const auto i = torch::tensor(std::vector<int64_t>{1, 2, 3, int64_t{1} << 40}),
             j = torch::tensor(std::vector<int64_t>{4, 3, 2, 7});
  check(ir, {i, j, torch::tensor({1.0f, 2.5f, 3.0f, -1.0f}), int64_t{2}, 0.5}, "int64 with float32");
}

TEST(StableHlo, ZeroCopiesViewsAndTransposes) {
  const std::string ir = R"IR(
graph(%a : Tensor, %b : Tensor):
  %none : NoneType = prim::Constant()
  %false : bool = prim::Constant[value=0]()
  %f32 : int = prim::Constant[value=6]()
  %i64 : int = prim::Constant[value=4]()
  %shape : int[] = prim::Constant[value=[6, 4]]()
  %wide : int[] = prim::Constant[value=[5, 2, 3, 4]]()
  %d0 : int = prim::Constant[value=0]()
  %d2 : int = prim::Constant[value=-1]()
  %z : Tensor = aten::zero(%a)
  %zl : Tensor = aten::zeros_like(%b, %none, %none, %none, %none, %none)
  %det : Tensor = aten::detach_copy(%a)
  %tof : Tensor = aten::_to_copy(%b, %f32, %none, %none, %none, %false, %none)
  %toi : Tensor = aten::_to_copy(%a, %i64, %none, %none, %none, %false, %none)
  %v : Tensor = aten::view_copy(%a, %shape)
  %t : Tensor = aten::t_copy(%v)
  %tr : Tensor = aten::transpose_copy(%a, %d0, %d2)
  %e : Tensor = aten::expand_copy(%a, %wide, %false)
  return (%z, %zl, %det, %tof, %toi, %v, %t, %tr, %e)
)IR";
  torch::manual_seed(1);
  const auto a = torch::randn({2, 3, 4}) * 4;
  check(ir, {a, torch::tensor({true, false})}, "[2,3,4]");
}

TEST(StableHlo, MatmulsWithAlphaAndBeta) {
  const std::string ir = R"IR(
graph(%self : Tensor, %m1 : Tensor, %m2 : Tensor, %beta : int, %alpha : int, %x : Tensor, %y : Tensor, %fbeta : float):
  %half : float = prim::Constant[value=0.5]()
  %two : float = prim::Constant[value=2.]()
  %zero : int = prim::Constant[value=0]()
  %mm : Tensor = aten::mm(%m1, %m2)
  %a1 : Tensor = aten::addmm(%self, %m1, %m2, %beta, %alpha)
  %a2 : Tensor = aten::addmm(%self, %m1, %m2, %half, %two)
  %a3 : Tensor = aten::addmm(%self, %m1, %m2, %zero, %alpha)
  %a4 : Tensor = aten::addmm(%self, %m1, %m2, %fbeta, %alpha)
  %b : Tensor = aten::bmm(%x, %y)
  return (%mm, %a1, %a2, %a3, %a4, %b)
)IR";
  torch::manual_seed(2);
  check(ir, {torch::randn({5}), torch::randn({3, 4}), torch::randn({4, 5}), int64_t{1}, int64_t{1},
             torch::randn({2, 3, 4}), torch::randn({2, 4, 6}), 0.25},
        "bias [5], alpha = beta = 1");
  // beta = 0 (a graph input): nan in self does not reach the result, as in libtorch.
  check(ir, {torch::full({1, 5}, NAN), torch::randn({7, 3}), torch::randn({3, 5}), int64_t{3}, int64_t{-2},
             torch::randn({1, 2, 3}), torch::randn({1, 3, 2}), 0.0},
        "self [1,5] of nan, beta = 0");
}

TEST(StableHlo, ReductionsComparisonsReluAndThresholdBackward) {
  const std::string ir = R"IR(
graph(%a : Tensor, %g : Tensor, %i : Tensor, %j : Tensor, %th : int):
  %none : NoneType = prim::Constant()
  %true : bool = prim::Constant[value=1]()
  %false : bool = prim::Constant[value=0]()
  %d0 : int[] = prim::Constant[value=[0]]()
  %d02 : int[] = prim::Constant[value=[0, -1]]()
  %f64 : int = prim::Constant[value=7]()
  %s0 : Tensor = aten::sum(%a, %d0, %true, %none)
  %s02 : Tensor = aten::sum(%a, %d02, %false, %none)
  %sall : Tensor = aten::sum(%a, %none)
  %sd : Tensor = aten::sum(%a, %f64)
  %mall : Tensor = aten::mean(%a, %none)
  %m0 : Tensor = aten::mean(%a, %d0, %false, %none)
  %eq : Tensor = aten::eq(%i, %j)
  %si : Tensor = aten::sum(%eq, %none)
  %r : Tensor = aten::relu(%a)
  %tb : Tensor = aten::threshold_backward(%g, %r, %th)
  return (%s0, %s02, %sall, %sd, %mall, %m0, %eq, %si, %r, %tb)
)IR";
  torch::manual_seed(3);
  const auto i = torch::randint(3, {2, 3, 4}, torch::kLong), j = torch::randint(3, {3, 4}, torch::kLong);
  check(ir, {torch::randn({2, 3, 4}), torch::randn({2, 3, 4}), i, j, int64_t{0}}, "[2,3,4]");
  check(ir, {torch::randn({5, 1, 7}), torch::randn({5, 1, 7}), torch::randint(2, {5, 1, 7}, torch::kLong),
             torch::randint(2, {7}, torch::kLong), int64_t{0}},
        "[5,1,7]");
}

TEST(StableHlo, LogSoftmaxNllLossAndTheirBackwardsWithIgnoredTargets) {
  // The MLP's loss and its gradient, as the lazy lowering writes them, with reduction mean (1),
  // sum (2) and none (0), with and without class weights.
  const std::string ir = R"IR(
graph(%x : Tensor, %target : Tensor, %w : Tensor, %grad : Tensor, %gnone : Tensor):
  %none : NoneType = prim::Constant()
  %dim : int = prim::Constant[value=1]()
  %false : bool = prim::Constant[value=0]()
  %mean : int = prim::Constant[value=1]()
  %sum : int = prim::Constant[value=2]()
  %red_none : int = prim::Constant[value=0]()
  %ignore : int = prim::Constant[value=-100]()
  %f32 : int = prim::Constant[value=6]()
  %ls : Tensor = aten::_log_softmax(%x, %dim, %false)
  %l1 : Tensor, %tw1 : Tensor = aten::nll_loss_forward(%ls, %target, %none, %mean, %ignore)
  %l2 : Tensor, %tw2 : Tensor = aten::nll_loss_forward(%ls, %target, %w, %sum, %ignore)
  %l3 : Tensor, %tw3 : Tensor = aten::nll_loss_forward(%ls, %target, %w, %mean, %ignore)
  %l4 : Tensor, %tw4 : Tensor = aten::nll_loss_forward(%ls, %target, %none, %red_none, %ignore)
  %g1 : Tensor = aten::nll_loss_backward(%grad, %ls, %target, %none, %mean, %ignore, %tw1)
  %g3 : Tensor = aten::nll_loss_backward(%grad, %ls, %target, %w, %mean, %ignore, %tw3)
  %g4 : Tensor = aten::nll_loss_backward(%gnone, %ls, %target, %none, %red_none, %ignore, %tw4)
  %gx : Tensor = aten::_log_softmax_backward_data(%g1, %ls, %dim, %f32)
  %gx3 : Tensor = aten::_log_softmax_backward_data(%g3, %ls, %dim, %f32)
  return (%ls, %l1, %tw1, %l2, %tw2, %l3, %tw3, %l4, %g1, %g3, %g4, %gx, %gx3)
)IR";
  torch::manual_seed(4);
  for (const auto& [n, c] : {std::pair<int64_t, int64_t>{64, 10}, {5, 3}, {1, 7}}) {
    check(ir,
          {torch::randn({n, c}) * 3, targets(n, c, 4), torch::rand({c}) + 0.1, torch::scalar_tensor(1.5),
           torch::randn({n})},
          "N " + std::to_string(n) + ", C " + std::to_string(c));
  }
  // Every target ignored: the mean is 0/0 = nan in libtorch too; only the sum reductions are compared.
  const std::string sums = R"IR(
graph(%x : Tensor, %target : Tensor):
  %none : NoneType = prim::Constant()
  %sum : int = prim::Constant[value=2]()
  %ignore : int = prim::Constant[value=-100]()
  %l : Tensor, %tw : Tensor = aten::nll_loss_forward(%x, %target, %none, %sum, %ignore)
  return (%l, %tw)
)IR";
  check(sums, {torch::randn({3, 4}), torch::full({3}, -100, torch::kLong)}, "all ignored");
  // A 1-d input with a 0-d target.
  check(sums, {torch::randn({4}), torch::scalar_tensor(2, torch::kLong)}, "[4] and a 0-d target");
}

TEST(StableHlo, SoftmaxAndItsBackward) {
  const std::string ir = R"IR(
graph(%x : Tensor, %g : Tensor):
  %dim : int = prim::Constant[value=-1]()
  %false : bool = prim::Constant[value=0]()
  %f32 : int = prim::Constant[value=6]()
  %s : Tensor = aten::_softmax(%x, %dim, %false)
  %gs : Tensor = aten::_softmax_backward_data(%g, %s, %dim, %f32)
  return (%s, %gs)
)IR";
  torch::manual_seed(5);
  check(ir, {torch::randn({2, 4, 8}) * 5, torch::randn({2, 4, 8})}, "[2,4,8]");
  check(ir, {torch::randn({3, 1}), torch::randn({3, 1})}, "[3,1]");
}

TEST(StableHlo, GeluAndItsBackwardBothApproximations) {
  const std::string ir = R"IR(
graph(%x : Tensor, %g : Tensor):
  %none : str = prim::Constant[value="none"]()
  %tanh : str = prim::Constant[value="tanh"]()
  %y : Tensor = aten::gelu(%x, %none)
  %gy : Tensor = aten::gelu_backward(%g, %x, %none)
  %t : Tensor = aten::gelu(%x, %tanh)
  %gt : Tensor = aten::gelu_backward(%g, %x, %tanh)
  return (%y, %gy, %t, %gt)
)IR";
  torch::manual_seed(6);
  // XLA:CPU's tanh is not libtorch's (Sleef's): the tanh form's derivative, where two terms
  // nearly cancel, differs by up to 2.5e-6 absolute; 5e-6 absolute here.
  const Tolerance tol{1e-5, 5e-6};
  check(ir, {torch::randn({4, 3, 8}) * 3, torch::randn({4, 3, 8})}, "[4,3,8]", tol);
  check(ir, {torch::linspace(-6, 6, 49), torch::ones({49})}, "[-6, 6]", tol);
}

TEST(StableHlo, NativeLayerNormWithAndWithoutAffine) {
  const std::string ir = R"IR(
graph(%x : Tensor, %w : Tensor, %b : Tensor):
  %none : NoneType = prim::Constant()
  %last : int[] = prim::Constant[value=[8]]()
  %two : int[] = prim::Constant[value=[3, 8]]()
  %eps : float = prim::Constant[value=1.0000000000000001e-05]()
  %y : Tensor, %mean : Tensor, %rstd : Tensor = aten::native_layer_norm(%x, %last, %w, %b, %eps)
  %y2 : Tensor, %mean2 : Tensor, %rstd2 : Tensor = aten::native_layer_norm(%x, %two, %none, %none, %eps)
  return (%y, %mean, %rstd, %y2, %mean2, %rstd2)
)IR";
  torch::manual_seed(7);
  check(ir, {torch::randn({2, 3, 8}) * 2 + 1, torch::randn({8}), torch::randn({8})}, "[2,3,8]");
}

TEST(StableHlo, NativeLayerNormBackward) {
  // Fed the forward's own mean and rstd, as in a training step.
  const std::string ir = R"IR(
graph(%x : Tensor, %w : Tensor, %b : Tensor, %g : Tensor):
  %none : NoneType = prim::Constant()
  %last : int[] = prim::Constant[value=[8]]()
  %eps : float = prim::Constant[value=1.0000000000000001e-05]()
  %all : bool[] = prim::Constant[value=[1, 1, 1]]()
  %input : bool[] = prim::Constant[value=[1, 0, 0]]()
  %y : Tensor, %mean : Tensor, %rstd : Tensor = aten::native_layer_norm(%x, %last, %w, %b, %eps)
  %gx : Tensor, %gw : Tensor, %gb : Tensor = aten::native_layer_norm_backward(%g, %x, %last, %mean, %rstd, %w, %b, %all)
  %gx2 : Tensor, %gw2 : Tensor, %gb2 : Tensor = aten::native_layer_norm_backward(%g, %x, %last, %mean, %rstd, %none, %none, %input)
  return (%gx, %gw, %gb, %gx2)
)IR";
  torch::manual_seed(9);
  check(ir, {torch::randn({2, 3, 8}) * 2 + 1, torch::randn({8}), torch::randn({8}), torch::randn({2, 3, 8})},
        "[2,3,8]");
  check(ir, {torch::randn({5, 8}), torch::randn({8}), torch::randn({8}), torch::randn({5, 8})}, "[5,8]");
}

TEST(StableHlo, StackCatAndSelectCopy) {
  // The logging's weighted mean: stack a float32 and a float64 0-d tensor (promoted), read rows
  // back with select_copy (a negative index too); cat along a middle dim.
  const std::string ir = R"IR(
graph(%a : Tensor, %b : Tensor, %x : Tensor, %y : Tensor):
  %zero : int = prim::Constant[value=0]()
  %one : int = prim::Constant[value=1]()
  %last : int = prim::Constant[value=-1]()
  %l : Tensor[] = prim::ListConstruct(%a, %b)
  %s : Tensor = aten::stack(%l, %zero)
  %s0 : Tensor = aten::select_copy(%s, %zero, %zero)
  %s1 : Tensor = aten::select_copy(%s, %zero, %last)
  %m : Tensor[] = prim::ListConstruct(%x, %y, %x)
  %c : Tensor = aten::cat(%m, %one)
  %t : Tensor = aten::stack(%m, %last)
  %r : Tensor = aten::select_copy(%c, %one, %last)
  return (%s, %s0, %s1, %c, %t, %r)
)IR";
  torch::manual_seed(14);
  check(ir, {torch::randn({}), torch::randn({}, torch::kDouble), torch::randn({2, 3, 4}), torch::randn({2, 3, 4})},
        "0-d and [2,3,4]");
}

TEST(StableHlo, PowOfNegativeBasesAndTensorExponents) {
  // x.pow(2) and its backward's x.pow(1.0) as the lazy lowering passes them (number exponents),
  // on negative bases too; a tensor exponent of a positive base.
  const std::string ir = R"IR(
graph(%x : Tensor, %p : Tensor, %e : Tensor):
  %two : int = prim::Constant[value=2]()
  %one : float = prim::Constant[value=1.]()
  %a : Tensor = aten::pow(%x, %two)
  %b : Tensor = aten::pow(%x, %one)
  %c : Tensor = aten::pow(%p, %e)
  return (%a, %b, %c)
)IR";
  torch::manual_seed(13);
  check(ir, {torch::randn({4, 5}) * 3, torch::rand({4, 5}) + 0.1, torch::randn({5})}, "[4,5]");
}

TEST(StableHlo, BatchNormTrainsEvaluatesAndUpdatesItsRunningStatistics) {
  // Training then evaluation on the same running statistics: the training op writes them in
  // place (libtorch's kernel, the TorchScript interpreter), so the evaluation reads the updated
  // ones, and @main returns them after the graph's outputs (Emission::updated_inputs).
  const std::string ir = R"IR(
graph(%x : Tensor, %w : Tensor, %b : Tensor, %rm : Tensor, %rv : Tensor, %g : Tensor):
  %true : bool = prim::Constant[value=1]()
  %false : bool = prim::Constant[value=0]()
  %none : NoneType = prim::Constant()
  %momentum : float = prim::Constant[value=0.10000000000000001]()
  %eps : float = prim::Constant[value=1.0000000000000001e-05]()
  %all : bool[] = prim::Constant[value=[1, 1, 1]]()
  %input : bool[] = prim::Constant[value=[1, 0, 0]]()
  %y : Tensor, %sm : Tensor, %si : Tensor = aten::native_batch_norm(%x, %w, %b, %rm, %rv, %true, %momentum, %eps)
  %gx : Tensor, %gw : Tensor, %gb : Tensor = aten::native_batch_norm_backward(%g, %x, %w, %rm, %rv, %sm, %si, %true, %eps, %all)
  %ye : Tensor, %em : Tensor, %ei : Tensor = aten::native_batch_norm(%x, %w, %b, %rm, %rv, %false, %momentum, %eps)
  %gxe : Tensor, %gwe : Tensor, %gbe : Tensor = aten::native_batch_norm_backward(%g, %x, %none, %rm, %rv, %none, %none, %false, %eps, %input)
  return (%y, %sm, %si, %gx, %gw, %gb, %ye, %em, %gxe)
)IR";
  torch::manual_seed(12);
  for (const std::vector<int64_t>& dims : {std::vector<int64_t>{6, 4}, std::vector<int64_t>{3, 4, 5, 2}}) {
    const std::string label = c10::str(c10::IntArrayRef(dims));
    SCOPED_TRACE(label);
    const std::vector<int64_t> c = {dims[1]};
    const std::vector<torch::Tensor> in = {torch::randn(dims) * 3 + 1, torch::randn(c), torch::randn(c),
                                           torch::randn(c), torch::rand(c) + 0.5, torch::randn(dims)};
    std::vector<IValue> eager_inputs;
    for (const auto& t : in) eager_inputs.emplace_back(t.clone());
    const auto graph = parse(ir);
    const std::vector<IValue> want = run_eager_and_type(*graph, eager_inputs);  // updates inputs 3 and 4
    const Emission e = emit_stablehlo(*graph);
    EXPECT_EQ(e.updated_inputs, (std::vector<size_t>{3, 4}));
    EXPECT_EQ(fulgur::xla::stablehlo::inputs_updated_in_place(*graph), (std::vector<size_t>{3, 4}));
    std::vector<IValue> inputs(in.begin(), in.end());
    std::vector<torch::Tensor> got = run_on_pjrt(*graph, inputs);
    ASSERT_EQ(got.size(), want.size() + 2);
    const std::vector<torch::Tensor> updated = {got[want.size()], got[want.size() + 1]};
    got.resize(want.size());
    expect_same(got, want, {}, label);
    expect_same(updated, {eager_inputs[3], eager_inputs[4]}, {}, label + " running statistics");
  }
}

TEST(StableHlo, EmbeddingGathersRows) {
  const std::string ir = R"IR(
graph(%w : Tensor, %i : Tensor, %j : Tensor):
  %pad : int = prim::Constant[value=-1]()
  %false : bool = prim::Constant[value=0]()
  %e : Tensor = aten::embedding(%w, %i, %pad, %false, %false)
  %f : Tensor = aten::embedding(%w, %j, %pad, %false, %false)
  return (%e, %f)
)IR";
  torch::manual_seed(8);
  check(ir, {torch::randn({77, 16}), torch::randint(77, {4, 6}, torch::kLong), torch::scalar_tensor(76, torch::kLong)},
        "[77,16] by [4,6] and by a 0-d index");
}

TEST(StableHlo, EmbeddingDenseBackwardAddsRepeatedIndicesAndSkipsPadding) {
  const std::string ir = R"IR(
graph(%g : Tensor, %i : Tensor):
  %v : int = prim::Constant[value=10]()
  %nopad : int = prim::Constant[value=-1]()
  %pad : int = prim::Constant[value=3]()
  %false : bool = prim::Constant[value=0]()
  %gw : Tensor = aten::embedding_dense_backward(%g, %i, %v, %nopad, %false)
  %gp : Tensor = aten::embedding_dense_backward(%g, %i, %v, %pad, %false)
  return (%gw, %gp)
)IR";
  torch::manual_seed(13);
  // 3 appears three times (and is the padding index of the second), 9 twice; 0 never.
  const auto indices = torch::tensor(std::vector<int64_t>{3, 9, 3, 1, 9, 3}).reshape({2, 3});
  check(ir, {torch::randn({2, 3, 4}), indices}, "[2,3] indices into 10 rows");
  check(ir, {torch::randn({32, 64, 16}), torch::randint(10, {32, 64}, torch::kLong)}, "[32,64] indices");
}

// As the CNN's graphs write them; the second convolution_backward leaves grad_input out.
const char* const kConvolutionIr = R"IR(
graph(%x : Tensor, %w : Tensor, %b : Tensor, %g : Tensor):
  %stride : int[] = prim::Constant[value=[STRIDE]]()
  %padding : int[] = prim::Constant[value=[PADDING]]()
  %dilation : int[] = prim::Constant[value=[DILATION]]()
  %false : bool = prim::Constant[value=0]()
  %no_pad : int[] = prim::Constant[value=[0, 0]]()
  %groups : int = prim::Constant[value=1]()
  %bias_sizes : int[] = prim::Constant[value=[BIAS]]()
  %all : bool[] = prim::Constant[value=[1, 1, 1]]()
  %no_input : bool[] = prim::Constant[value=[0, 1, 1]]()
  %y : Tensor = aten::convolution(%x, %w, %b, %stride, %padding, %dilation, %false, %no_pad, %groups)
  %gx : Tensor, %gw : Tensor, %gb : Tensor = aten::convolution_backward(%g, %x, %w, %bias_sizes, %stride, %padding, %dilation, %false, %no_pad, %groups, %all)
  %gx2 : Tensor, %gw2 : Tensor, %gb2 : Tensor = aten::convolution_backward(%g, %x, %w, %bias_sizes, %stride, %padding, %dilation, %false, %no_pad, %groups, %no_input)
  return (%y, %gx, %gw, %gb, %gw2)
)IR";

// Runs `body(ir, inputs, label)` for each convolution case: kConvolutionIr with its window, and
// random input, kernel, bias and output gradient.
template <class Body>
void for_each_convolution(Body body) {
  struct Case {
    std::vector<int64_t> x, w;
    std::string stride, padding, dilation;
    std::vector<int64_t> y;
  };
  torch::manual_seed(14);
  for (const Case& c : {Case{{4, 1, 28, 28}, {16, 1, 5, 5}, "1, 1", "2, 2", "1, 1", {4, 16, 28, 28}},
                        Case{{2, 3, 9, 8}, {5, 3, 3, 2}, "2, 3", "1, 0", "1, 1", {2, 5, 5, 3}},
                        Case{{2, 2, 10, 10}, {3, 2, 3, 3}, "2, 2", "0, 1", "2, 1", {2, 3, 3, 5}}}) {
    std::string text = kConvolutionIr;
    for (const auto& [key, value] : {std::pair<std::string, std::string>{"STRIDE", c.stride}, {"PADDING", c.padding},
                                     {"DILATION", c.dilation}, {"BIAS", std::to_string(c.w[0])}})
      text = std::regex_replace(text, std::regex(key), value);
    const std::string label = "input " + c10::str(c.x) + " kernel " + c10::str(c.w) + " stride " + c.stride +
                              " padding " + c.padding + " dilation " + c.dilation;
    body(text, std::vector<torch::Tensor>{torch::randn(c.x), torch::randn(c.w) * 0.3, torch::randn({c.w[0]}),
                                          torch::randn(c.y)},
         label);
  }
}

TEST(StableHlo, ConvolutionAndItsBackward) {
  for_each_convolution([](const std::string& text, const std::vector<torch::Tensor>& inputs, const std::string& label) {
    // float32: grad_weight sums up to 4 * 28 * 28 products (sums of std 50 and more), grad_input
    // 400, in another order than libtorch: differences up to 1.5e-4 and 1.2e-5 were seen, so
    // 1e-4 relative + 5e-5 absolute here, and the formulas are checked exactly in float64.
    check(text, {inputs[0], inputs[1], inputs[2], inputs[3]}, label, {1e-4, 5e-5});
    check(text, {inputs[0].to(torch::kDouble), inputs[1].to(torch::kDouble), inputs[2].to(torch::kDouble),
                 inputs[3].to(torch::kDouble)},
          label + ", float64", {1e-12, 1e-12});
  });
}

namespace {
// Registers the host kernels with the process's plugin, once for every test that runs in it.
void register_host_kernels() {
  static const bool registered = [] {
    fulgur::xla::host_kernels::register_with(pjrt::process_client().plugin());
    return true;
  }();
  (void)registered;
}
}  // namespace

// With EmitOptions::host_convolutions every convolution and convolution gradient is a custom call
// of libtorch's own kernel (xla/host_kernels.h), which XLA runs in the compiled program: the
// results are eager libtorch's to the bit, in float32 and float64, partial masks included.
TEST(StableHlo, ConvolutionsOnHostKernelsAreLibtorchsOwn) {
  register_host_kernels();
  fulgur::xla::stablehlo::EmitOptions host;
  host.host_convolutions = true;
  {
    const auto graph = parse(std::regex_replace(
        std::regex_replace(std::regex_replace(std::regex_replace(kConvolutionIr, std::regex("STRIDE"), "1, 1"),
                                              std::regex("PADDING"), "0, 0"),
                           std::regex("DILATION"), "1, 1"),
        std::regex("BIAS"), "3"));
    run_eager_and_type(*graph, {torch::randn({1, 2, 5, 5}), torch::randn({3, 2, 3, 3}), torch::randn({3}),
                                torch::randn({1, 3, 3, 3})});
    const std::string module = emit_stablehlo(*graph, host).module;
    EXPECT_EQ(module.find("stablehlo.convolution"), std::string::npos) << module;
    EXPECT_NE(module.find("call_target_name = \"fulgur_convolution_backward\""), std::string::npos) << module;
    EXPECT_NE(module.find("output_mask = array<i64: 0, 1, 1>"), std::string::npos) << module;
  }
  for_each_convolution([&](const std::string& text, const std::vector<torch::Tensor>& inputs, const std::string& label) {
    check(text, {inputs[0], inputs[1], inputs[2], inputs[3]}, label, {0, 0}, host);
    check(text, {inputs[0].to(torch::kDouble), inputs[1].to(torch::kDouble), inputs[2].to(torch::kDouble),
                 inputs[3].to(torch::kDouble)},
          label + ", float64", {0, 0}, host);
  });
}

// A host kernel that cannot run fails the execution with its own message, naming the target and
// the cause, and the process goes on.
TEST(StableHlo, AHostKernelsErrorFailsTheExecutionWithItsMessage) {
  register_host_kernels();
  const pjrt::Client& client = pjrt::process_client();
  const pjrt::Executable exe = client.compile(
      "func.func @main(%x: tensor<1x1x3x3xf32>, %w: tensor<1x1x2x2xf32>) -> tensor<1x1x2x2xf32> {\n"
      "  %0 = \"stablehlo.custom_call\"(%x, %w) {call_target_name = \"fulgur_convolution\", api_version = 4 : i32, "
      "backend_config = {groups = 1 : i64}} : (tensor<1x1x3x3xf32>, tensor<1x1x2x2xf32>) -> tensor<1x1x2x2xf32>\n"
      "  return %0 : tensor<1x1x2x2xf32>\n}\n");
  const pjrt::Buffer x = pjrt::to_device(client, torch::ones({1, 1, 3, 3})),
                     w = pjrt::to_device(client, torch::ones({1, 1, 2, 2}));
  try {
    std::vector<pjrt::Buffer> out = exe.execute({&x, &w});
    pjrt::to_tensor(out.at(0));
    FAIL() << "no error";
  } catch (const pjrt::PjrtError& e) {
    EXPECT_NE(std::string(e.what()).find("fulgur_convolution: attribute stride is missing (the call has: groups)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(torch::equal(pjrt::to_tensor(pjrt::to_device(client, torch::ones({2}))), torch::ones({2})));
}

// A convolution of one input feature with at most 25 kernel taps (float32/float64, groups 1) is
// written as a sum of shifted windows times the taps, not as a stablehlo.convolution (XLA:CPU's
// Eigen convolution is slow there, bench/RESULTS.md); others stay one stablehlo.convolution.
// float32 within 1e-5 relative + 1e-5 absolute (sums of up to 25 products of values of std
// about 1, added in tap order, where oneDNN may fuse multiply-adds: 2e-6 seen), float64 1e-12.
TEST(StableHlo, ConvolutionOfOneInputFeatureIsASumOfShiftedWindows) {
  const std::string ir = R"IR(
graph(%x : Tensor, %w : Tensor, %b : Tensor):
  %stride : int[] = prim::Constant[value=[STRIDE]]()
  %padding : int[] = prim::Constant[value=[PADDING]]()
  %dilation : int[] = prim::Constant[value=[DILATION]]()
  %false : bool = prim::Constant[value=0]()
  %no_pad : int[] = prim::Constant[value=[NOPAD]]()
  %groups : int = prim::Constant[value=1]()
  %y : Tensor = aten::convolution(%x, %w, %b, %stride, %padding, %dilation, %false, %no_pad, %groups)
  %r : Tensor = aten::relu(%y)
  return (%r, %y)
)IR";
  struct Case {
    std::vector<int64_t> x, w;
    std::string stride, padding, dilation;
    bool shifted_sum;
  };
  torch::manual_seed(16);
  for (const Case& c : {// the MNIST CNN's conv1, its batch of 64
                        Case{{64, 1, 28, 28}, {16, 1, 5, 5}, "1, 1", "2, 2", "1, 1", true},
                        Case{{3, 1, 11, 9}, {4, 1, 3, 2}, "2, 3", "1, 0", "2, 1", true},
                        Case{{2, 1, 7, 8}, {3, 1, 1, 1}, "1, 1", "0, 0", "1, 1", true},
                        // one spatial dim: 5 taps
                        Case{{2, 1, 20}, {6, 1, 5}, "2", "3", "2", true},
                        // 36 taps, and 2 input features: a stablehlo.convolution
                        Case{{2, 1, 12, 12}, {4, 1, 6, 6}, "1, 1", "2, 2", "1, 1", false},
                        Case{{2, 2, 12, 12}, {4, 2, 5, 5}, "1, 1", "2, 2", "1, 1", false}}) {
    std::string text = ir;
    const std::string output_padding = c.x.size() == 3 ? "0" : "0, 0";
    for (const auto& [key, value] : {std::pair<std::string, std::string>{"STRIDE", c.stride}, {"PADDING", c.padding},
                                     {"DILATION", c.dilation}, {"NOPAD", output_padding}})
      text = std::regex_replace(text, std::regex(key), value);
    const std::string label = "input " + c10::str(c.x) + " kernel " + c10::str(c.w) + " stride " + c.stride +
                              " padding " + c.padding + " dilation " + c.dilation;
    SCOPED_TRACE(label);
    const std::vector<torch::Tensor> inputs = {torch::randn(c.x), torch::randn(c.w), torch::randn({c.w[0]})};
    check(text, {inputs[0], inputs[1], inputs[2]}, label, {1e-5, 1e-5});
    check(text, {inputs[0].to(torch::kDouble), inputs[1].to(torch::kDouble), inputs[2].to(torch::kDouble)},
          label + ", float64", {1e-12, 1e-12});
    const auto graph = parse(text);
    run_eager_and_type(*graph, {inputs[0], inputs[1], inputs[2]});
    const std::string module = emit_stablehlo(*graph).module;
    EXPECT_EQ(module.find("stablehlo.convolution") == std::string::npos, c.shifted_sum) << module;
  }
}

namespace {

// A max pool's shape case: the input's and output's sizes and the pool's window, written into
// an IR text's KERNEL, STRIDE and PADDING; `flag` is what the test checks of its lowering.
struct PoolCase {
  std::vector<int64_t> x;
  std::string kernel, stride, padding;
  std::vector<int64_t> y;
  bool flag;
};

// `ir` with the case's window written in, and a label naming the case.
std::pair<std::string, std::string> pool_text(const std::string& ir, const PoolCase& c) {
  std::string text = ir;
  for (const auto& [key, value] : {std::pair<std::string, std::string>{"KERNEL", c.kernel}, {"STRIDE", c.stride},
                                   {"PADDING", c.padding}})
    text = std::regex_replace(text, std::regex(key), value);
  return {text, "input " + c10::str(c.x) + " kernel " + c.kernel + " stride " + c.stride + " padding " + c.padding};
}

}  // namespace

TEST(StableHlo, MaxPoolWithIndicesAndItsBackward) {
  const std::string ir = R"IR(
graph(%x : Tensor, %g : Tensor):
  %kernel : int[] = prim::Constant[value=[KERNEL]]()
  %stride : int[] = prim::Constant[value=[STRIDE]]()
  %padding : int[] = prim::Constant[value=[PADDING]]()
  %dilation : int[] = prim::Constant[value=[1, 1]]()
  %false : bool = prim::Constant[value=0]()
  %y : Tensor, %i : Tensor = aten::max_pool2d_with_indices(%x, %kernel, %stride, %padding, %dilation, %false)
  %gx : Tensor = aten::max_pool2d_with_indices_backward(%g, %x, %kernel, %stride, %padding, %dilation, %false, %i)
  return (%y, %i, %gx)
)IR";
  torch::manual_seed(15);
  // flag: the windows overlap (they keep the scatter; the others are a select).
  for (const PoolCase& c : {PoolCase{{4, 16, 28, 28}, "2, 2", "", "0, 0", {4, 16, 14, 14}, false},
                            PoolCase{{2, 3, 7, 9}, "3, 2", "2, 2", "1, 1", {2, 3, 4, 5}, true},
                            PoolCase{{3, 5, 6}, "3, 3", "1, 1", "0, 0", {3, 3, 4}, true},
                            // Padding, and rows and columns no window reaches (floor mode).
                            PoolCase{{2, 3, 7, 9}, "2, 3", "2, 3", "1, 1", {2, 3, 4, 3}, false},
                            PoolCase{{3, 8, 7}, "3, 3", "3, 3", "0, 0", {3, 2, 2}, false},
                            PoolCase{{2, 2, 12, 10}, "4, 5", "4, 5", "0, 0", {2, 2, 3, 2}, false}}) {
    const auto [text, label] = pool_text(ir, c);
    check(text, {torch::randn(c.x), torch::randn(c.y)}, label);
    // Ties (values from a few levels): each window's first maximum, as libtorch picks it.
    check(text, {torch::randint(3, c.x).to(torch::kFloat), torch::randn(c.y)}, label + ", ties");
    // Windows of -inf alone: the index of the first element.
    check(text, {torch::where(torch::rand(c.x) < 0.7, -std::numeric_limits<float>::infinity(), torch::randn(c.x)),
                 torch::randn(c.y)},
          label + ", -inf");
    // Zeros of either sign (-0.0 and 0.0 tie): the first.
    check(text, {torch::where(torch::rand(c.x) < 0.5, -0.0f, 0.0f) * (torch::rand(c.x) < 0.8).to(torch::kFloat),
                 torch::randn(c.y)},
          label + ", signed zeros");
    check(text, {torch::randint(3, c.x, torch::kDouble), torch::randn(c.y, torch::kDouble)}, label + ", float64 ties");
    // NaNs of either sign, often several in a window: a NaN wins, of several the last.
    for (auto dtype : {torch::kFloat, torch::kDouble}) {
      const auto nan = torch::full(c.x, std::numeric_limits<double>::quiet_NaN(), dtype);
      const auto x = torch::where(torch::rand(c.x) < 0.3, torch::where(torch::rand(c.x) < 0.5, nan, -nan),
                                  torch::randn(c.x, dtype));
      check(text, {x, torch::randn(c.y, dtype)}, label + ", NaN " + c10::toString(dtype));
    }
    const auto graph = parse(text);
    run_eager_and_type(*graph, {torch::randn(c.x), torch::randn(c.y)});
    const std::string module = emit_stablehlo(*graph).module;
    EXPECT_EQ(module.find("stablehlo.scatter") != std::string::npos, c.flag) << module;
    // Float32 packs value and index into one int64 for one reduce_window of one result.
    EXPECT_NE(module.find("\"stablehlo.shift_left\""), std::string::npos) << module;
  }
}

// A ReLU (or any threshold) before a max pool: threshold_backward(max_pool_backward(g, x), x, t).
// For pools whose windows do not overlap the emitter thresholds g against the pooled maxima
// before the pool's backward, at the pool's output size; the results must be libtorch's exactly,
// ties, zeros of both signs, NaN and values at the threshold included.
TEST(StableHlo, AThresholdBeforeATiledMaxPoolIsAppliedAtThePoolsSize) {
  const std::string ir = R"IR(
graph(%x : Tensor, %g : Tensor, %t : float):
  %kernel : int[] = prim::Constant[value=[KERNEL]]()
  %stride : int[] = prim::Constant[value=[STRIDE]]()
  %padding : int[] = prim::Constant[value=[PADDING]]()
  %dilation : int[] = prim::Constant[value=[1, 1]]()
  %false : bool = prim::Constant[value=0]()
  %r : Tensor = aten::relu(%x)
  %y : Tensor, %i : Tensor = aten::max_pool2d_with_indices(%r, %kernel, %stride, %padding, %dilation, %false)
  %gy : Tensor = aten::max_pool2d_with_indices_backward(%g, %r, %kernel, %stride, %padding, %dilation, %false, %i)
  %gr : Tensor = aten::threshold_backward(%gy, %r, %t)
  %gx : Tensor = aten::threshold_backward(%gr, %x, %t)
  return (%y, %gr, %gx)
)IR";
  torch::manual_seed(17);
  // flag: the windows do not overlap (the threshold moves before the pool's backward).
  for (const PoolCase& c : {PoolCase{{4, 16, 28, 28}, "2, 2", "", "0, 0", {4, 16, 14, 14}, true},
                            PoolCase{{2, 3, 7, 9}, "2, 3", "2, 3", "1, 1", {2, 3, 4, 3}, true},
                            PoolCase{{3, 8, 7}, "3, 3", "3, 3", "0, 0", {3, 2, 2}, true},
                            PoolCase{{2, 3, 7, 9}, "3, 2", "2, 2", "1, 1", {2, 3, 4, 5}, false}}) {
    const auto [text, label] = pool_text(ir, c);
    const Tolerance exact{0, 0};
    for (double t : {0.0, 0.5, -1.0}) {
      const std::string at = label + ", threshold " + std::to_string(t);
      check(text, {torch::randn(c.x), torch::randn(c.y), t}, at, exact);
      // Ties, and values equal to the threshold.
      check(text, {torch::randint(-2, 3, c.x).to(torch::kFloat) * 0.5, torch::randn(c.y), t}, at + ", ties", exact);
      check(text, {torch::where(torch::rand(c.x) < 0.5, -0.0f, 0.0f), torch::randn(c.y), t}, at + ", signed zeros",
            exact);
      check(text,
            {torch::where(torch::rand(c.x) < 0.1, std::numeric_limits<float>::quiet_NaN(), torch::randn(c.x)),
             torch::randn(c.y), t},
            at + ", NaN", exact);
      check(text, {torch::randint(-2, 3, c.x, torch::kDouble), torch::randn(c.y, torch::kDouble), t},
            at + ", float64 ties", exact);
    }
    const auto graph = parse(text);
    run_eager_and_type(*graph, {torch::randn(c.x), torch::randn(c.y), 0.0});
    const std::string module = emit_stablehlo(*graph).module;
    // The threshold on the ReLU's output compares at the pool's size when the windows do not
    // overlap, at the input's otherwise; the one on %x (no pool between) at the input's always.
    auto compares_at = [&](const std::vector<int64_t>& dims) {
      std::string type = "tensor<";
      for (int64_t d : dims) type += std::to_string(d) + "x";
      type += "i1>";
      size_t count = 0;
      for (size_t at = module.find("comparison_direction LE"); at != std::string::npos;
           at = module.find("comparison_direction LE", at + 1)) {
        const size_t end = module.find('\n', at);
        if (module.substr(at, end - at).find("-> " + type) != std::string::npos) ++count;
      }
      return count;
    };
    EXPECT_EQ(compares_at(c.y), c.flag ? 1u : 0u) << module;
    EXPECT_EQ(compares_at(c.x), c.flag ? 1u : 2u) << module;
  }
}

TEST(StableHlo, UnknownOpsAreReportedByNameAndDeadOnesIgnored) {
  const auto graph = parse(R"IR(
graph(%a : Tensor, %b : Tensor):
  %mode : str = prim::Constant[value="floor"]()
  %c : Tensor = aten::cos(%a)
  %d : Tensor = aten::div(%a, %b, %mode)
  %dead : Tensor = aten::sin(%a)
  %e : Tensor = aten::mul(%c, %d)
  %f : Tensor = aten::cos(%e)
  %g : Tensor = aten::relu(%b)
  return (%f, %g)
)IR");
  run_eager_and_type(*graph, {torch::ones({2}), torch::ones({2})});
  // Known kinds are checked only when every kind is known.
  Emission e = emit_stablehlo(*graph);
  EXPECT_EQ(e.unsupported, (std::vector<std::string>{"aten::cos"}));
  EXPECT_EQ(e.module, "");

  const auto known = parse(R"IR(
graph(%a : Tensor, %b : Tensor):
  %mode : str = prim::Constant[value="floor"]()
  %dead : Tensor = aten::sin(%a)
  %d : Tensor = aten::div(%a, %b, %mode)
  %e : Tensor = aten::mul(%d, %b)
  return (%e, %a)
)IR");
  for (torch::jit::Value* v : known->inputs()) v->setType(c10::TensorType::createContiguous(c10::kFloat, c10::kCPU, {2}));
  for (torch::jit::Node* n : known->nodes())
    if (n->kind() != c10::prim::Constant) n->output()->setType(c10::TensorType::createContiguous(c10::kFloat, c10::kCPU, {2}));
  // The rounding mode is reported; the mul that uses the division's result is skipped, not reported.
  e = emit_stablehlo(*known);
  EXPECT_EQ(e.unsupported, (std::vector<std::string>{"aten::div (rounding_mode 'floor')"}));
  EXPECT_EQ(e.module, "");
}

TEST(StableHlo, TypedIrTextAsInTheHeaderExample) {
  // Types written in the IR text instead of set from a run; a complex input is reported.
  const auto graph = parse(
      "graph(%a : Float(2, 3), %b : Float(3)):\n  %c : Float(2, 3) = aten::mul(%a, %b)\n  return (%c)\n");
  const Emission e = emit_stablehlo(*graph);
  ASSERT_EQ(e.unsupported, std::vector<std::string>{});
  EXPECT_NE(e.module.find("\"stablehlo.multiply\""), std::string::npos) << e.module;
  const pjrt::Client& client = pjrt::process_client();
  const auto a = torch::randn({2, 3}), b = torch::randn({3});
  const pjrt::Buffer da = pjrt::to_device(client, a), db = pjrt::to_device(client, b);
  const auto out = client.compile(e.module).execute({&da, &db});
  EXPECT_TRUE(torch::allclose(pjrt::to_tensor(out.at(0)), a * b));

  const auto complex = parse("graph(%a : ComplexFloat(2)):\n  %c : ComplexFloat(2) = aten::mul(%a, %a)\n  return (%c)\n");
  EXPECT_EQ(emit_stablehlo(*complex).unsupported, (std::vector<std::string>{"graph input 0 (dtype ComplexFloat)"}));
}

// Input/output aliases: kept for an input one op reads whose result has its type (an optimizer
// state's update), dropped for an input read twice (a weight), a result of another type, and a
// second alias of one input or result. The compiled program updates the kept one in place.
TEST(StableHlo, AliasesAreDeclaredForSingleUseInputsOfTheResultsType) {
  const auto graph = parse(R"IR(
graph(%m : Float(4, 3), %w : Float(4, 3), %g : Float(4, 3), %h : Double(4, 3)):
  %k : float = prim::Constant[value=0.5]()
  %m2 : Float(4, 3) = aten::mul(%m, %k)
  %w2 : Float(4, 3) = aten::add(%w, %g, %k)
  %y : Float(4, 3) = aten::mul(%w, %m2)
  %h2 : Double(4, 3) = aten::mul(%h, %k)
  return (%m2, %w2, %y, %h2)
)IR");
  const std::vector<Alias> asked{{0, 0}, {1, 1}, {2, 3}, {0, 2}, {3, 3}, {3, 0}};
  const Emission e = emit_stablehlo(*graph, {}, asked);
  ASSERT_EQ(e.unsupported, std::vector<std::string>{});
  // %m (one use) with %m2; %w is read twice; %g's result has another type; {0, 2} is a second
  // alias of %m; %h with %h2 (one use, same type); {3, 0} a second of %h.
  EXPECT_EQ(e.aliases, (std::vector<Alias>{{0, 0}, {3, 3}})) << e.module;
  EXPECT_NE(e.module.find("%a0: tensor<4x3xf32> {tf.aliasing_output = 0 : i32}"), std::string::npos) << e.module;
  EXPECT_NE(e.module.find("%a3: tensor<4x3xf64> {tf.aliasing_output = 3 : i32}"), std::string::npos) << e.module;
  EXPECT_EQ(emit_stablehlo(*graph).aliases, std::vector<Alias>{});

  const pjrt::Client& client = pjrt::process_client();
  const auto m = torch::randn({4, 3}), w = torch::randn({4, 3}), g = torch::randn({4, 3});
  const auto h = torch::randn({4, 3}, torch::kDouble);
  auto dm = std::make_shared<const pjrt::Buffer>(pjrt::to_device(client, m));
  const pjrt::Buffer dw = pjrt::to_device(client, w), dg = pjrt::to_device(client, g), dh = pjrt::to_device(client, h);
  const auto out = client.compile(e.module).execute({dm.get(), &dw, &dg, &dh}, {dm});
  EXPECT_TRUE(dm->is_deleted());
  EXPECT_TRUE(torch::allclose(pjrt::to_tensor(out.at(0)), m * 0.5));
  EXPECT_TRUE(torch::allclose(pjrt::to_tensor(out.at(1)), w + g * 0.5));
  EXPECT_TRUE(torch::allclose(pjrt::to_tensor(out.at(2)), w * m * 0.5));
  EXPECT_TRUE(torch::allclose(pjrt::to_tensor(out.at(3)), h * 0.5));
  EXPECT_TRUE(torch::equal(pjrt::to_tensor(dh), h)) << "a kept argument changed";
}

TEST(StableHlo, UntypedGraphIsAnErrorNamingTheValue) {
  const auto graph = parse(R"IR(
graph(%a : Tensor):
  %r : Tensor = aten::relu(%a)
  return (%r)
)IR");
  try {
    emit_stablehlo(*graph);
    FAIL() << "emitted an untyped graph";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("%a"), std::string::npos) << e.what();
  }
  graph->inputs()[0]->setType(c10::TensorType::createContiguous(c10::kFloat, c10::kCPU, {3}));
  try {
    emit_stablehlo(*graph);
    FAIL() << "emitted a graph with an untyped output";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("of aten::relu has no scalar type"), std::string::npos) << e.what();
  }
}

// The MLP's whole steps as the lazy TorchScript lowering wrote them (tests/data, copied from
// the graphs of issue 12's spec): forward, loss and backward; Adam's update; validation. Each
// prints its compile time and its largest difference.
TEST(StableHlo, WholeMlpForwardBackwardStepMatchesTheInterpreter) {
  torch::manual_seed(10);
  // alpha = beta = 1 for the addmms; the relu thresholds are ints too, so 1 tests them off zero.
  const auto graph = step_graph("mlp_fwbw_step1");
  check_step("mlp_fwbw_step1", graph, step_inputs("mlp_fwbw_step1", *graph, 1), {1e-5, 1e-6});
}

TEST(StableHlo, WholeMlpAdamStepMatchesTheInterpreter) {
  torch::manual_seed(11);
  const auto graph = step_graph("mlp_opt_step1");
  check_step("mlp_opt_step1", graph, step_inputs("mlp_opt_step1", *graph, 1), {1e-5, 1e-6});
}

TEST(StableHlo, WholeMlpValidationStepMatchesTheInterpreter) {
  torch::manual_seed(12);
  const auto graph = step_graph("mlp_eval_step1");
  check_step("mlp_eval_step1", graph, step_inputs("mlp_eval_step1", *graph, 1), {1e-5, 1e-6});
}

// The character model's (2 layers, 4 heads, T 64, C 128, batch 32): embeddings, layer norms,
// attention (bmm, softmax), gelu, and their backwards; AdamW; validation.
TEST(StableHlo, WholeCharlmForwardBackwardStepMatchesTheInterpreter) {
  torch::manual_seed(20);
  const auto graph = step_graph("charlm_fwbw_step1");
  check_step("charlm_fwbw_step1", graph, step_inputs("charlm_fwbw_step1", *graph, 1), {1e-5, 1e-6});
}

TEST(StableHlo, WholeCharlmAdamWStepMatchesTheInterpreter) {
  torch::manual_seed(21);
  const auto graph = step_graph("charlm_opt_step1");
  check_step("charlm_opt_step1", graph, step_inputs("charlm_opt_step1", *graph, 1), {1e-5, 1e-6});
}

TEST(StableHlo, WholeCharlmValidationStepMatchesTheInterpreter) {
  torch::manual_seed(22);
  const auto graph = step_graph("charlm_eval_step1");
  check_step("charlm_eval_step1", graph, step_inputs("charlm_eval_step1", *graph, 1), {1e-5, 1e-6});
}

// The MNIST CNN's (two 5x5 convolutions with padding 2, 2x2 max pools, batch 64): convolution
// gradients are sums of up to 64 * 28 * 28 products, so 1e-4 relative + 1e-4 absolute.
TEST(StableHlo, WholeCnnForwardBackwardStepMatchesTheInterpreter) {
  torch::manual_seed(30);
  const auto graph = step_graph("cnn_fwbw_step1");
  check_step("cnn_fwbw_step1", graph, step_inputs("cnn_fwbw_step1", *graph, 1), {1e-4, 1e-4});
}

TEST(StableHlo, WholeCnnAdamStepMatchesTheInterpreter) {
  torch::manual_seed(31);
  const auto graph = step_graph("cnn_opt_step1");
  check_step("cnn_opt_step1", graph, step_inputs("cnn_opt_step1", *graph, 1), {1e-5, 1e-6});
}

TEST(StableHlo, WholeCnnValidationStepMatchesTheInterpreter) {
  torch::manual_seed(32);
  const auto graph = step_graph("cnn_eval_step1");
  check_step("cnn_eval_step1", graph, step_inputs("cnn_eval_step1", *graph, 1), {1e-4, 1e-4});
}

// The second steps: the forward/backward adds into the gradients of the first (aten::add,
// aten::zero), Adam's update reads the state the first made. Tolerances as for the first steps.
TEST(StableHlo, WholeSecondStepsOfTheThreeModelsMatchTheInterpreter) {
  torch::manual_seed(40);
  for (const auto& [step, tol] : {std::pair<std::string, Tolerance>{"mlp_fwbw_step2", {1e-5, 1e-6}},
                                  {"mlp_opt_step2", {1e-5, 1e-6}},
                                  {"cnn_fwbw_step2", {1e-4, 1e-4}},
                                  {"cnn_opt_step2", {1e-5, 1e-6}},
                                  {"charlm_fwbw_step2", {1e-5, 1e-6}},
                                  {"charlm_opt_step2", {1e-5, 1e-6}}}) {
    const auto graph = step_graph(step);
    check_step(step, graph, step_inputs(step, *graph, 1), tol);
  }
}

// Issue 32, A4: bfloat16 sums, means and layer-norm statistics accumulate in float32 as
// libtorch's kernels do, the result rounded once. Summed in bfloat16, 67,600 ones stop at 256 + 1
// (the spacing of bf16 at 256 is 2), and 67,600 itself is not a bf16 number: libtorch gives
// 67,584 and a mean of exactly 1.
TEST(StableHlo, Bf16ReductionsAccumulateInFloat32AsLibtorch) {
  const std::string ir = R"IR(
graph(%a : Tensor, %x : Tensor, %w : Tensor, %b : Tensor):
  %none : NoneType = prim::Constant()
  %shape : int[] = prim::Constant[value=[4096]]()
  %eps : float = prim::Constant[value=1.0000000000000001e-05]()
  %s : Tensor = aten::sum(%a, %none)
  %m : Tensor = aten::mean(%a, %none)
  %y : Tensor, %mu : Tensor, %rstd : Tensor = aten::native_layer_norm(%x, %shape, %w, %b, %eps)
  return (%s, %m, %y, %mu, %rstd)
)IR";
  torch::manual_seed(5);
  const auto ones = torch::ones({67600}, torch::kBFloat16);
  const auto x = (torch::randn({2, 4096}) * 3 + 100).to(torch::kBFloat16);
  const auto w = torch::randn({4096}).to(torch::kBFloat16), b = torch::randn({4096}).to(torch::kBFloat16);
  const std::vector<IValue> inputs{ones, x, w, b};
  const auto graph = parse(ir);
  const std::vector<IValue> want = run_eager_and_type(*graph, inputs);
  EXPECT_EQ(want.at(0).toTensor().item<float>(), 67584.0f) << "libtorch's own sum";
  const auto got = run_on_pjrt(*graph, inputs);
  EXPECT_EQ(got.at(0).item<float>(), 67584.0f);
  EXPECT_EQ(got.at(1).item<float>(), 1.0f);
  check(ir, inputs, "bf16, 67600 and 2x4096", {1e-2, 1e-2});
}

// Issue 32, A5: what the pjrt backend's Compile makes of a graph. An op without a lowering keeps
// it on TorchScript (the reasons come back, nothing is compiled); a failure of the emitter (here
// its own check that a lowering made the declared type) or of the compile is an error naming
// what failed, with the graph, never a silent fallback.
TEST(StableHlo, OnlyAnOpWithoutALoweringFallsBackAndAnEmitterOrCompileFailureIsAnError) {
  const std::string ir = R"IR(
graph(%a : Tensor):
  %r : Tensor = aten::relu(%a)
  return (%r)
)IR";
  const auto graph = parse(ir);
  run_eager_and_type(*graph, {torch::randn({3})});
  int compiled = 0;
  EXPECT_TRUE(fulgur::xla::detail::emit_then_compile(*graph, {}, {}, [&](const fulgur::xla::stablehlo::Emission&) { ++compiled; }).empty());
  EXPECT_EQ(compiled, 1);

  const auto with_cos = parse(R"IR(
graph(%a : Tensor):
  %r : Tensor = aten::cos(%a)
  return (%r)
)IR");
  run_eager_and_type(*with_cos, {torch::randn({3})});
  const auto reasons = fulgur::xla::detail::emit_then_compile(*with_cos, {}, {}, [&](const fulgur::xla::stablehlo::Emission&) { ++compiled; });
  ASSERT_EQ(reasons.size(), 1u);
  EXPECT_EQ(reasons[0], "aten::cos");
  EXPECT_EQ(compiled, 1) << "a graph that falls back is not compiled";

  try {
    fulgur::xla::detail::emit_then_compile(*graph, {}, {}, [](const fulgur::xla::stablehlo::Emission&) {
      throw std::runtime_error("the plugin's parse error");
    });
    ADD_FAILURE() << "a compile failure fell back";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("compiling its StableHLO failed on a graph: the plugin's parse error"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("aten::relu(%a)"));
  }

  // The graph declares relu's output of 4 elements while its input has 3: the lowering makes 3,
  // and the emitter's own check throws.
  graph->outputs()[0]->setType(c10::TensorType::createContiguous(c10::kFloat, c10::kCPU, {4}));
  try {
    fulgur::xla::detail::emit_then_compile(*graph, {}, {}, [&](const fulgur::xla::stablehlo::Emission&) { ++compiled; });
    ADD_FAILURE() << "an emitter failure fell back";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("the StableHLO emitter failed on a graph: lowering of aten::relu made"));
  }
  EXPECT_EQ(compiled, 1);
}

// Issue 32, A4: every other reduction of 16-bit floats accumulates in float32 too, as libtorch's
// CPU kernels do (their opmath type), the result rounded once: the softmax family's row sums,
// the batch norm statistics and their running updates, the norms' backward sums, the NLL loss's
// sum and total weight, a convolution's bias gradient. Summed in bfloat16, 4096 terms of about 1
// stop growing near 512 (the spacing there is 4), and a channel of 32 x 32 x 32 values loses its
// mean; each output below then differs from libtorch's by far more than the tolerance, about one
// bfloat16 rounding (2^-8 relative) where the kernels sum in another order.
//
// A backward reads the forward's saved values as graph inputs, as eager libtorch computed and
// rounded them: within one graph XLA may keep a bfloat16 intermediate in float32 (its default
// xla_allow_excess_precision drops a convert to bfloat16 and back), which is more precise than
// eager and not what this test is about.
TEST(StableHlo, Bf16SoftmaxNormAndLossReductionsAccumulateInFloat32AsLibtorch) {
  const std::string softmax_ir = R"IR(
graph(%x : Tensor, %g : Tensor, %target : Tensor, %s : Tensor, %ls : Tensor):
  %none : NoneType = prim::Constant()
  %dim : int = prim::Constant[value=-1]()
  %false : bool = prim::Constant[value=0]()
  %bf16 : int = prim::Constant[value=15]()
  %mean : int = prim::Constant[value=1]()
  %sum : int = prim::Constant[value=2]()
  %ignore : int = prim::Constant[value=-100]()
  %so : Tensor = aten::_softmax(%x, %dim, %false)
  %gs : Tensor = aten::_softmax_backward_data(%g, %s, %dim, %bf16)
  %lso : Tensor = aten::_log_softmax(%x, %dim, %false)
  %gls : Tensor = aten::_log_softmax_backward_data(%g, %ls, %dim, %bf16)
  %l1 : Tensor, %tw1 : Tensor = aten::nll_loss_forward(%ls, %target, %none, %mean, %ignore)
  %l2 : Tensor, %tw2 : Tensor = aten::nll_loss_forward(%ls, %target, %none, %sum, %ignore)
  return (%so, %gs, %lso, %gls, %l1, %tw1, %l2, %tw2)
)IR";
  torch::manual_seed(15);
  const auto bf = [](const torch::Tensor& t) { return t.to(torch::kBFloat16); };
  {
    // Rows 4096 wide. The gradient is 1 plus a little, so that grad - sum(grad * s) is a small
    // difference of two numbers near 1, which shows an error in the sum. The loss: 4096 rows of
    // 4096 classes (about 8.3 each, summed past 30,000), none ignored.
    const auto x = bf(torch::randn({4096, 4096}));
    const auto s = torch::_softmax(x, -1, false), ls = torch::_log_softmax(x, -1, false);
    check(softmax_ir, {x, bf(1 + torch::randn({4096, 4096}) * 0.01), torch::randint(4096, {4096}, torch::kLong), s, ls},
          "bf16 [4096, 4096]", {1e-2, 1e-3});
  }

  // Batch norm over 32 x 32 x 32 values per channel, off zero so that a lost mean shows; its
  // backward reads the statistics eager saved.
  const std::string batch_norm_ir = R"IR(
graph(%x : Tensor, %w : Tensor, %b : Tensor, %rm : Tensor, %rv : Tensor, %g : Tensor, %sm : Tensor, %si : Tensor):
  %true : bool = prim::Constant[value=1]()
  %momentum : float = prim::Constant[value=0.10000000000000001]()
  %eps : float = prim::Constant[value=1.0000000000000001e-05]()
  %all : bool[] = prim::Constant[value=[1, 1, 1]]()
  %o : Tensor, %m : Tensor, %i : Tensor = aten::native_batch_norm(%x, %w, %b, %rm, %rv, %true, %momentum, %eps)
  %gx : Tensor, %gw : Tensor, %gb : Tensor = aten::native_batch_norm_backward(%g, %x, %w, %rm, %rv, %sm, %si, %true, %eps, %all)
  return (%o, %m, %i, %gx, %gw, %gb)
)IR";
  {
    const auto x = bf(torch::randn({32, 4, 32, 32}) * 2 + 10), w = bf(torch::randn({4})), b = bf(torch::randn({4}));
    const auto rm = bf(torch::randn({4})), rv = bf(torch::rand({4}) + 0.5);
    const auto [o, sm, si] = torch::native_batch_norm(x, w, b, rm.clone(), rv.clone(), true, 0.1, 1e-5);
    const std::vector<torch::Tensor> in = {x, w, b, rm, rv, bf(torch::randn({32, 4, 32, 32}) + 1), sm, si};
    std::vector<IValue> eager_inputs;
    for (const auto& t : in) eager_inputs.emplace_back(t.clone());
    const auto graph = parse(batch_norm_ir);
    const std::vector<IValue> want = run_eager_and_type(*graph, eager_inputs);  // updates inputs 3 and 4
    std::vector<torch::Tensor> got = run_on_pjrt(*graph, std::vector<IValue>(in.begin(), in.end()));
    ASSERT_EQ(got.size(), want.size() + 2);
    const std::vector<torch::Tensor> updated = {got[want.size()], got[want.size() + 1]};
    got.resize(want.size());
    expect_same(got, want, {1e-2, 1e-3}, "bf16 batch norm [32, 4, 32, 32]");
    expect_same(updated, {eager_inputs[3], eager_inputs[4]}, {1e-2, 4e-3}, "bf16 running statistics");
  }

  // Layer norm's backward: rows of 4096 (grad_input's sums), and 4096 rows of 64 (the weight's
  // and bias's sums over the rows). libtorch's CPU kernel sums those two in bfloat16 itself (4096
  // gradients of about 1 give 2048): they are compared with its float32 results rounded, which is
  // what the emitter gives.
  const std::string layer_norm_ir = R"IR(
graph(%y : Tensor, %w : Tensor, %b : Tensor, %g : Tensor, %mean : Tensor, %rstd : Tensor):
  %shape : int[] = prim::Constant[value=[WIDTH]]()
  %all : bool[] = prim::Constant[value=[1, 1, 1]]()
  %gx : Tensor, %gw : Tensor, %gb : Tensor = aten::native_layer_norm_backward(%g, %y, %shape, %mean, %rstd, %w, %b, %all)
  return (%gx, %gw, %gb)
)IR";
  for (const auto& [rows, width] : {std::pair<int64_t, int64_t>{8, 4096}, {4096, 64}}) {
    const std::string label = "bf16 layer norm backward [" + std::to_string(rows) + ", " + std::to_string(width) + "]";
    std::string ir = layer_norm_ir;
    ir.replace(ir.find("WIDTH"), 5, std::to_string(width));
    const auto y = bf(torch::randn({rows, width}) * 3 + 5), w = bf(torch::randn({width})), b = bf(torch::randn({width}));
    const auto g = bf(torch::randn({rows, width}) + 1);
    const auto [o, mean, rstd] = torch::native_layer_norm(y, {width}, w, b, 1e-5);
    const std::vector<IValue> inputs{y, w, b, g, mean, rstd};
    const auto graph = parse(ir);
    const std::vector<IValue> want = run_eager_and_type(*graph, inputs);
    const auto f = [](const torch::Tensor& t) { return t.to(torch::kFloat); };
    const auto [fx, fw, fb] = torch::native_layer_norm_backward(f(g), f(y), {width}, f(mean), f(rstd), f(w), f(b),
                                                                {true, true, true});
    const std::vector<torch::Tensor> got = run_on_pjrt(*graph, inputs);
    ASSERT_EQ(got.size(), 3u);
    expect_same({got[0]}, {want[0]}, {1e-2, 1e-2}, label + ", grad_input");
    expect_same({got[1], got[2]}, {bf(fw), bf(fb)}, {1e-2, 1e-2}, label + ", grad_weight and grad_bias");
  }

  // A convolution's bias gradient sums 64 x 32 x 32 values per output feature.
  const std::string bias_ir = R"IR(
graph(%x : Tensor, %w : Tensor, %g : Tensor):
  %one : int[] = prim::Constant[value=[1]]()
  %zero : int[] = prim::Constant[value=[0]]()
  %false : bool = prim::Constant[value=0]()
  %groups : int = prim::Constant[value=1]()
  %bias : int[] = prim::Constant[value=[2]]()
  %mask : bool[] = prim::Constant[value=[0, 0, 1]]()
  %gx : Tensor, %gw : Tensor, %gb : Tensor = aten::convolution_backward(%g, %x, %w, %bias, %one, %zero, %one, %false, %zero, %groups, %mask)
  return (%gb)
)IR";
  check(bias_ir, {bf(torch::randn({64, 3, 34, 34})), bf(torch::randn({2, 3, 3, 3})), bf(torch::randn({64, 2, 32, 32}) + 1)},
        "bf16 bias gradient of [64, 2, 32, 32]", {1e-2, 1e-2});
}
