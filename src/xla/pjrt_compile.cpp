// SPDX-License-Identifier: Apache-2.0
#include "xla/pjrt_compile.h"

#include "runtime/env.h"
#include "runtime/log.h"

#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/lazy/backend/backend_interface.h>
#include <torch/csrc/lazy/ts_backend/ts_backend_impl.h>

#include <chrono>
#include <mutex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <unordered_map>

#include "xla/host_kernels.h"
#include "xla/pjrt_backend.h"
#include "xla/pjrt_data.h"
#include "xla/updated_data.h"

namespace fulgur::xla {
namespace detail {
namespace {

// How graphs are emitted for the process's client, decided at the first compile.
// FULGUR_XLA_HOST_KERNELS=1 makes convolutions on the CPU plugin call libtorch's kernels
// (xla/host_kernels.h), 0 keeps XLA's own; unset, the CPU plugin uses libtorch's, which were
// faster for the MNIST CNN's step on one process and on two workers (figures in
// bench/history/libtorch-1.13.md). A plugin of another platform runs XLA's own. The CPU plugin
// also gets the emitter's xla_cpu platform rules (EmitOptions::xla_cpu).
const stablehlo::EmitOptions& emit_options() {
  static const stablehlo::EmitOptions options = [] {
    stablehlo::EmitOptions o;
    const std::string v = runtime::env_string("FULGUR_XLA_HOST_KERNELS");
    if (!v.empty() && v != "0" && v != "1")
      throw std::invalid_argument("FULGUR_XLA_HOST_KERNELS='" + v +
                                  "' is not valid: \"0\" (XLA's own convolutions), \"1\" (convolutions on the "
                                  "CPU plugin run libtorch's kernels), or unset (libtorch's on the CPU plugin, "
                                  "XLA's own on others)");
    const pjrt::Client& client = pjrt::process_client();
    const bool cpu = client.platform_name() == "cpu";
    o.xla_cpu = cpu;  // the XLA:CPU forms of the shifted-sum convolution and the packed max pool
    if (v == "0") return o;
    if (v == "1" && !cpu)
      throw std::invalid_argument("FULGUR_XLA_HOST_KERNELS=1 needs the CPU plugin; the plugin " +
                                  client.plugin().path() + " runs on '" + client.platform_name() + "'");
    if (!cpu) return o;
    host_kernels::register_with(client.plugin());
    o.host_convolutions = true;
    std::lock_guard<std::mutex> lock(metrics_mutex());
    metrics().host_convolutions = true;
    return o;
  }();
  return options;
}

// The graph of a lowering with its input/output aliases (PjrtLoweringContext).
class LoweredComputation : public lazy::TSComputation {
 public:
  LoweredComputation(const std::shared_ptr<torch::jit::Graph>& graph, std::vector<stablehlo::Alias> aliases,
                     std::vector<long> node_holds)
      : lazy::TSComputation(graph), aliases(std::move(aliases)), node_holds(std::move(node_holds)) {}
  std::vector<stablehlo::Alias> aliases;
  // Per parameter, the device-data nodes of the graph that hold its data (see PjrtComputation).
  std::vector<long> node_holds;
};

// The TorchScript lowering, with the input/output aliases of the data an update replaces: a
// parameter marked UpdatedBy (xla/updated_data.h) is aliased to the result of the node output
// that computes its new value.
class PjrtLoweringContext : public lazy::TSLoweringContext {
 public:
  PjrtLoweringContext(const std::string& name, lazy::BackendDevice device, c10::ArrayRef<const lazy::Node*> post_order,
                      lazy::Util::EmissionMap emit_status)
      : lazy::TSLoweringContext(name, std::move(device), post_order, std::move(emit_status)) {
    for (const lazy::Node* node : post_order) {
      if (const lazy::BackendDataPtr d = lazy::getBackend()->GetComputationDataFromNode(node)) ++node_holds_[d.get()];
    }
  }
  size_t AddResult(const lazy::Output& output) override {
    results_.push_back(output);
    return lazy::TSLoweringContext::AddResult(output);
  }
  // The shapes are compared when the graph is emitted (stablehlo::Emission::aliases), once the
  // results are typed.
  lazy::ComputationPtr Build() override {
    auto built = lazy::TSLoweringContext::Build();  // registers the graph's outputs
    std::vector<stablehlo::Alias> aliases;
    const auto& params = GetParametersData();
    for (size_t k = 0; k < params.size(); ++k) {
      const auto* mark = dynamic_cast<const UpdatedBy*>(params[k]->info());
      if (!mark) continue;
      for (size_t i = 0; i < results_.size(); ++i) {
        if (mark->is(results_[i])) {
          aliases.push_back({k, i});
          break;
        }
      }
    }
    std::vector<long> holds(params.size(), 0);
    for (size_t k = 0; k < params.size(); ++k) {
      const auto it = node_holds_.find(params[k].get());
      if (it != node_holds_.end()) holds[k] = it->second;
    }
    return std::make_shared<LoweredComputation>(static_cast<lazy::TSComputation&>(*built).graph(), aliases, holds);
  }

 private:
  std::vector<lazy::Output> results_;  // in the order of the graph's outputs
  std::unordered_map<const lazy::BackendData*, long> node_holds_;  // device-data nodes per data
};

// The graph with the tensor types this backend set taken off again, for the TorchScript
// interpreter of a graph that falls back.
std::shared_ptr<torch::jit::Graph> untyped_copy(torch::jit::Graph& g) {
  auto copy = g.copy();
  auto untype = [](torch::jit::Value* v) {
    if (v->type()->cast<c10::TensorType>()) v->setType(c10::TensorType::get());
  };
  for (auto* v : copy->inputs()) untype(v);
  for (auto* n : copy->nodes()) {
    if (n->kind() == c10::prim::Constant) continue;
    for (auto* v : n->outputs()) untype(v);
  }
  return copy;
}

std::vector<lazy::Shape> output_shapes_of(const torch::jit::Graph& g) {
  std::vector<lazy::Shape> shapes;
  for (const auto* v : g.outputs()) {
    const auto t = v->type()->cast<c10::TensorType>();
    if (!t || !t->scalarType() || !t->sizes().concrete_sizes())
      throw std::invalid_argument("graph output %" + v->debugName() + " is not a typed tensor");
    shapes.emplace_back(*t->scalarType(), *t->sizes().concrete_sizes());
  }
  return shapes;
}

std::set<std::string> warned_;

void note_fallback(const std::vector<std::string>& reasons) {
  std::lock_guard<std::mutex> lock(metrics_mutex());
  ++metrics().graphs_fallen_back;
  for (const auto& r : reasons) {
    ++metrics().fallbacks[r];
    // Once per op in the whole run: each stage's workers would warn again.
    if (warned_.insert(r).second) {
      runtime::warn_rank_zero_once("xla (pjrt): a graph with " + r +
                                   " runs on the TorchScript backend instead of XLA (warned once per op; counts in "
                                   "fulgur::xla::metrics_report())");
    }
  }
}

}  // namespace

std::unique_ptr<lazy::LoweringContext> make_lowering_context(const std::string& name, lazy::BackendDevice device,
                                                           c10::ArrayRef<const lazy::Node*> post_order,
                                                           lazy::Util::EmissionMap emit_status) {
  auto ctx = std::make_unique<PjrtLoweringContext>(name, device, post_order, emit_status);
  auto* tsctx = ctx.get();
  // Outputs: the lazy nodes' shapes.
  for (const lazy::Node* node : post_order) {
    for (size_t i = 0; i < node->num_outputs(); ++i) {
      torch::jit::Value* v = tsctx->GetOutputOp(lazy::Output(node, i));
      if (!v->type()->cast<c10::TensorType>()) continue;  // a scalar parameter (int/float)
      const lazy::Shape& s = node->shape(i);
      v->setType(c10::TensorType::createContiguous(s.scalar_type(), c10::kCPU, s.sizes()));
    }
  }
  // Inputs: the parameters' data (graph input k is parameter k).
  auto graph = tsctx->graph();
  const auto& params = tsctx->GetParametersData();
  for (size_t k = 0; k < params.size() && k < graph->inputs().size(); ++k) {
    torch::jit::Value* v = graph->inputs()[k];
    if (!v->type()->cast<c10::TensorType>()) continue;
    auto d = std::static_pointer_cast<lazy::TSData>(params[k]);
    if (!dynamic_cast<PjrtData*>(d.get()) && d->HasValue()) {
      const at::Tensor t = d->data();
      v->setType(c10::TensorType::createContiguous(t.scalar_type(), c10::kCPU, t.sizes()));
    } else {
      v->setType(c10::TensorType::createContiguous(d->shape().scalar_type(), c10::kCPU, d->shape().sizes()));
    }
  }
  return ctx;
}

std::shared_ptr<PjrtComputation> compile_computation(const lazy::ComputationPtr& instance) {
  auto* tsc = static_cast<lazy::TSComputation*>(instance.get());
  const auto graph = tsc->graph();
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::string> reasons;
  std::shared_ptr<pjrt::Executable> exe;
  std::vector<lazy::Shape> shapes;
  std::vector<size_t> updated;
  std::vector<stablehlo::Alias> aliases;
  const auto* lowered = dynamic_cast<const LoweredComputation*>(tsc);
  const stablehlo::EmitOptions& options = emit_options();  // a bad setting is the user's error
  // Aliases only at a step mark, as torch_xla: a graph run to read a value early (item())
  // leaves the updated tensors' old data in use.
  reasons = emit_then_compile(
      *graph, options, lowered && instance->in_mark_step ? lowered->aliases : std::vector<stablehlo::Alias>{},
      [&](const stablehlo::Emission& e) {
        shapes = output_shapes_of(*graph);
        updated = e.updated_inputs;
        aliases = e.aliases;
        exe = std::make_shared<pjrt::Executable>(pjrt::process_client().compile(e.module));
      });
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::shared_ptr<PjrtComputation> c;
  if (exe) {
    c = std::make_shared<PjrtComputation>(graph, std::move(exe), std::move(shapes), std::move(updated),
                                          std::move(aliases), lowered ? lowered->node_holds : std::vector<long>{});
    std::lock_guard<std::mutex> lock(metrics_mutex());
    ++metrics().graphs_compiled;
    metrics().compile_seconds += dt;
  } else {
    note_fallback(reasons);
    c = std::make_shared<PjrtComputation>(untyped_copy(*graph), nullptr, std::vector<lazy::Shape>{},
                                          stablehlo::inputs_updated_in_place(*graph));
  }
  c->in_mark_step = instance->in_mark_step;
  return c;
}

std::vector<std::string> emit_then_compile(const torch::jit::Graph& graph, const stablehlo::EmitOptions& options,
                                           const std::vector<stablehlo::Alias>& aliases,
                                           const std::function<void(const stablehlo::Emission&)>& compile) {
  auto failure = [&](const std::string& who, const std::exception& ex) {
    std::ostringstream os;
    os << "xla (pjrt): " << who << " failed on a graph: " << ex.what()
       << "\n(a fault of fulgur's or of the plugin, not an op without a lowering; such a graph is not run on "
          "TorchScript instead). The graph:\n"
       << graph;
    return std::runtime_error(os.str());
  };
  stablehlo::Emission e;
  try {
    e = stablehlo::emit_stablehlo(graph, options, aliases);
  } catch (const std::exception& ex) {
    throw failure("the StableHLO emitter", ex);
  }
  if (!e.unsupported.empty()) return e.unsupported;
  try {
    compile(e);
  } catch (const std::exception& ex) {
    throw failure("compiling its StableHLO", ex);
  }
  return {};
}

}  // namespace detail
}  // namespace fulgur::xla
