// SPDX-License-Identifier: Apache-2.0
// The lazy backend on PJRT; see pjrt_backend.h. Long because libtorch's BackendImplInterface is
// one class: data, lowering (aliases, donation), compile and execution share its state.

#include "xla/pjrt_backend.h"

#include "runtime/env.h"
#include "runtime/log.h"

#include <ATen/FunctionalTensorWrapper.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/lazy/backend/backend_interface.h>
#include <torch/csrc/lazy/core/ir.h>
#include <torch/csrc/lazy/core/ir_builder.h>
#include <torch/csrc/lazy/core/metrics.h>
#include <torch/csrc/lazy/core/tensor.h>
#include <torch/csrc/lazy/core/tensor_impl.h>
#include <torch/csrc/lazy/core/tensor_util.h>
#include <torch/csrc/lazy/ts_backend/ts_backend_impl.h>
#include <torch/csrc/lazy/ts_backend/ts_lowering_context.h>
#include <torch/library.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>

#include "xla/host_kernels.h"
#include "xla/pjrt/client.h"
#include "xla/pjrt/tensors.h"
#include "xla/stablehlo/emitter.h"
#include "xla/updated_data.h"

namespace fulgur::xla {
namespace {

namespace lazy = torch::lazy;

std::mutex metrics_mu;
PjrtBackendMetrics metrics_;
std::set<std::string> warned_;

void count_bytes(int64_t up, int64_t down) {
  std::lock_guard<std::mutex> lock(metrics_mu);
  metrics_.bytes_to_device += up;
  metrics_.bytes_to_host += down;
}

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
    std::lock_guard<std::mutex> lock(metrics_mu);
    metrics_.host_convolutions = true;
    return o;
  }();
  return options;
}

// Device data of this backend: a PJRT buffer on the process's device. It derives from TSData
// because the TorchScript lowering casts every parameter to TSData to read `scalar`; numbers
// (MakeComputationDataFromScalar) stay plain TSData. A placeholder (CreateDataPlaceholder) has
// no buffer until the lazy core assigns it an execution's result. PJRT buffers are immutable,
// so the buffer is shared, never copied, when data is assigned.
class PjrtData : public lazy::TSData {
 public:
  PjrtData(const lazy::Shape& shape, const lazy::BackendDevice& device) : lazy::TSData(shape, device) {}
  PjrtData(std::shared_ptr<const pjrt::Buffer> buffer, const lazy::Shape& shape, const lazy::BackendDevice& device)
      : lazy::TSData(shape, device), buffer_(std::move(buffer)) {}

  bool HasValue() const override { return buffer_ != nullptr; }
  void Assign(const lazy::BackendData& data) override;

  const std::shared_ptr<const pjrt::Buffer>& buffer() const { return buffer_; }
  // The value after a graph updated this input in place (a batch norm's running statistics).
  void set_buffer(std::shared_ptr<const pjrt::Buffer> buffer) { buffer_ = std::move(buffer); }

 private:
  std::shared_ptr<const pjrt::Buffer> buffer_;
};

lazy::Shape shape_of(const at::Tensor& t) {
  return lazy::Shape(t.scalar_type(), std::vector<int64_t>(t.sizes().begin(), t.sizes().end()));
}

std::shared_ptr<const pjrt::Buffer> upload(const at::Tensor& t) {
  auto b = std::make_shared<const pjrt::Buffer>(pjrt::to_device(pjrt::process_client(), t));
  count_bytes(static_cast<int64_t>(t.nbytes()), 0);
  return b;
}

// The device buffer of a number a graph takes as an argument: tensor<f64> for a float, tensor<i64>
// for an int or bool (the emitter's number inputs). Kept by value, so that the numbers that are
// the same every step (an optimizer's learning rate, betas, eps, weight decay) are uploaded once,
// not each run: about 40 uploads a step for Adam. Numbers that change (bias corrections) fill
// the cache; it is emptied when it holds kMaxCachedNumbers. Buffers given as arguments are
// never donated, so one buffer serves every graph that takes the same number.
constexpr size_t kMaxCachedNumbers = 256;

std::shared_ptr<const pjrt::Buffer> number_buffer(const at::Scalar& s) {
  // Never destroyed, like the process's client: no buffer is destroyed after the client, nor in
  // a forked child at exit.
  static std::mutex& mu = *new std::mutex;
  static auto& cache = *new std::map<std::pair<bool, int64_t>, std::shared_ptr<const pjrt::Buffer>>;
  const bool floating = s.isFloatingPoint();
  int64_t bits = 0;
  if (floating) {
    const double v = s.toDouble();
    std::memcpy(&bits, &v, sizeof bits);  // by bits: -0.0 and each NaN stay themselves
  } else {
    bits = s.toLong();
  }
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(floating, bits);
  if (const auto it = cache.find(key); it != cache.end()) return it->second;
  if (cache.size() >= kMaxCachedNumbers) cache.clear();
  auto b = upload(floating ? at::scalar_tensor(s.toDouble(), at::kDouble) : at::scalar_tensor(bits, at::kLong));
  cache.emplace(key, b);
  return b;
}

at::Tensor download(const pjrt::Buffer& b) {
  at::Tensor t = pjrt::to_tensor(b);
  count_bytes(0, static_cast<int64_t>(t.nbytes()));
  return t;
}

void PjrtData::Assign(const lazy::BackendData& data) {
  if (const auto* p = dynamic_cast<const PjrtData*>(&data)) {
    buffer_ = p->buffer_;
    return;
  }
  // Host data of the TorchScript backend (none reaches here today; kept correct all the same).
  auto& ts = const_cast<lazy::TSData&>(static_cast<const lazy::TSData&>(data));
  buffer_ = ts.HasValue() ? upload(ts.data()) : nullptr;
}

// The CPU tensor of a device datum: downloaded from its buffer, or the TorchScript data's own.
at::Tensor host_tensor(const lazy::BackendDataPtr& data) {
  if (const auto* p = dynamic_cast<const PjrtData*>(data.get())) {
    if (!p->buffer())
      throw std::logic_error("xla (pjrt): reading device data that holds no value yet (shape " +
                             p->shape().to_string() + ")");
    return download(*p->buffer());
  }
  return std::static_pointer_cast<lazy::TSData>(data)->data();
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

void note_fallback(const std::vector<std::string>& reasons) {
  std::lock_guard<std::mutex> lock(metrics_mu);
  ++metrics_.graphs_fallen_back;
  for (const auto& r : reasons) {
    ++metrics_.fallbacks[r];
    // Once per op in the whole run: each stage's workers would warn again.
    if (warned_.insert(r).second) {
      runtime::warn_rank_zero_once("xla (pjrt): a graph with " + r +
                                   " runs on the TorchScript backend instead of XLA (warned once per op; counts in "
                                   "fulgur::xla::metrics_report())");
    }
  }
}

class PjrtBackendImpl : public lazy::BackendImplInterface {
 public:
  static lazy::BackendImplInterface* ts() { return lazy::GetTSBackendImpl(); }

  void InitializeAtenBindings() const override { ts()->InitializeAtenBindings(); }
  void PrepareToExit() const override { ts()->PrepareToExit(); }
  void SetRngSeed(size_t seed) const override { ts()->SetRngSeed(seed); }
  const lazy::IrBuilder* GetIrBuilder() const override { return ts()->GetIrBuilder(); }

  // Uploaded at once: the caller's tensor may change after this returns.
  lazy::BackendDataPtr MakeComputationDataFromTensor(const at::Tensor& tensor, const lazy::Shape& shape,
                                                     const lazy::BackendDevice& device) const override {
    const at::Tensor t = tensor.scalar_type() == shape.scalar_type() ? tensor : tensor.to(shape.scalar_type());
    return std::make_shared<PjrtData>(upload(t), shape, device);
  }
  lazy::BackendDataPtr MakeComputationDataFromScalar(const at::Scalar& scalar,
                                                     const lazy::BackendDevice& device) const override {
    return ts()->MakeComputationDataFromScalar(scalar, device);
  }
  lazy::BackendDataPtr CreateDataPlaceholder(const lazy::BackendDevice& device,
                                             const lazy::Shape& shape) const override {
    return std::make_shared<PjrtData>(shape, device);
  }
  lazy::BackendDataPtr GetComputationDataFromNode(const lazy::Node* node) const override {
    return ts()->GetComputationDataFromNode(node);
  }
  // A new CPU tensor each time (the caller may write into it).
  at::Tensor MakeTensorFromComputationData(const lazy::BackendDataPtr data,
                                           c10::optional<at::ScalarType> logical_scalar_type) const override {
    if (dynamic_cast<const PjrtData*>(data.get())) return host_tensor(data);
    return ts()->MakeTensorFromComputationData(data, logical_scalar_type);
  }

  std::unique_ptr<lazy::LoweringContext> CreateLoweringContext(const std::string& name, lazy::BackendDevice device,
                                                               c10::ArrayRef<const lazy::Node*> post_order,
                                                               lazy::Util::EmissionMap emit_status) const override {
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
  std::unique_ptr<lazy::LoweringContext> CreateLoweringContext(const std::string& name,
                                                               lazy::BackendDevice device) const override {
    return ts()->CreateLoweringContext(name, device);
  }
  std::vector<std::string> GetCompilationDevices(const std::string& device,
                                                 c10::ArrayRef<std::string> devices) const override {
    return ts()->GetCompilationDevices(device, devices);
  }

  std::vector<lazy::ComputationPtr> Compile(std::vector<lazy::ComputationPtr> instances) const override {
    std::vector<lazy::ComputationPtr> out;
    for (auto& instance : ts()->Compile(instances)) {
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
      reasons = detail::emit_then_compile(
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
        std::lock_guard<std::mutex> lock(metrics_mu);
        ++metrics_.graphs_compiled;
        metrics_.compile_seconds += dt;
      } else {
        note_fallback(reasons);
        c = std::make_shared<PjrtComputation>(untyped_copy(*graph), nullptr, std::vector<lazy::Shape>{},
                                              stablehlo::inputs_updated_in_place(*graph));
      }
      c->in_mark_step = instance->in_mark_step;
      out.push_back(std::move(c));
    }
    return out;
  }

  std::vector<lazy::BackendDataPtr> ExecuteComputation(lazy::ComputationPtr computation,
                                                       c10::ArrayRef<lazy::BackendDataPtr> arguments,
                                                       const lazy::BackendDevice& device) const override {
    auto* pc = dynamic_cast<PjrtComputation*>(computation.get());
    if (!pc || !pc->executable) return execute_on_torchscript(computation, arguments, device);
    // Arguments stay on the device; numbers are uploaded the first time each value is seen.
    std::vector<std::shared_ptr<const pjrt::Buffer>> keep;
    std::vector<const pjrt::Buffer*> args;
    keep.reserve(arguments.size());
    args.reserve(arguments.size());
    for (const auto& a : arguments) {
      if (const auto* p = dynamic_cast<const PjrtData*>(a.get())) {
        if (!p->buffer())
          throw std::logic_error("xla (pjrt): an argument of a graph holds no value (shape " + p->shape().to_string() +
                                 ")");
        args.push_back(p->buffer().get());
        continue;
      }
      auto d = std::static_pointer_cast<lazy::TSData>(a);
      keep.push_back(d->scalar.has_value() ? number_buffer(*d->scalar) : upload(d->data()));
      args.push_back(keep.back().get());
    }
    // An aliased argument is donated when nothing but this execution holds it: the lazy core's
    // parameter list and this graph's device-data nodes (node_holds) hold the device data object,
    // and that object alone holds the buffer. A tensor whose value it still is, another pending
    // graph's node or data sharing the buffer (Assign) would each hold one more, and then the
    // plugin copies the argument instead. After the execution the donors lose their buffers: the
    // lazy core reads them no more, and a stray read is an error, not garbage. (A failed
    // execution leaves them as they are.)
    std::vector<std::shared_ptr<const pjrt::Buffer>> donated;
    std::vector<PjrtData*> donors;
    int64_t donated_bytes = 0;
    for (const stablehlo::Alias& al : pc->aliases) {
      const auto& a = arguments[al.input];
      auto* p = dynamic_cast<PjrtData*>(a.get());
      const long holds = 1 + (al.input < pc->node_holds.size() ? pc->node_holds[al.input] : 0);
      if (!p || !p->buffer() || a.use_count() > holds || p->buffer().use_count() != 1) continue;
      donated.push_back(p->buffer());
      donors.push_back(p);
      donated_bytes += static_cast<int64_t>(p->shape().numel() * c10::elementSize(p->shape().scalar_type()));
    }
    std::vector<pjrt::Buffer> outs = pc->executable->execute(args, std::move(donated));
    for (PjrtData* p : donors) p->set_buffer(nullptr);
    const size_t n = pc->output_shapes.size();
    if (outs.size() != n + pc->updated_inputs.size())
      throw std::logic_error("xla (pjrt): an executable gave " + std::to_string(outs.size()) + " results for " +
                             std::to_string(n) + " outputs and " + std::to_string(pc->updated_inputs.size()) +
                             " updated inputs");
    std::vector<lazy::BackendDataPtr> results;
    results.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      results.push_back(std::make_shared<PjrtData>(std::make_shared<const pjrt::Buffer>(std::move(outs[i])),
                                                   pc->output_shapes[i], device));
    }
    for (size_t j = 0; j < pc->updated_inputs.size(); ++j) {
      auto p = std::dynamic_pointer_cast<PjrtData>(arguments[pc->updated_inputs[j]]);
      if (!p) throw std::logic_error("xla (pjrt): a graph updates an argument that is not device data");
      p->set_buffer(std::make_shared<const pjrt::Buffer>(std::move(outs[n + j])));
    }
    std::lock_guard<std::mutex> lock(metrics_mu);
    ++metrics_.executions;
    metrics_.buffers_donated += static_cast<int64_t>(donors.size());
    metrics_.bytes_donated += donated_bytes;
    return results;
  }

  std::shared_ptr<lazy::BackendDeviceType> GetDefaultDeviceType() const override {
    return ts()->GetDefaultDeviceType();
  }
  void SetDefaultDeviceType(int8_t type) override { ts()->SetDefaultDeviceType(type); }
  int64_t GetDefaultDeviceOrdinal() const override { return ts()->GetDefaultDeviceOrdinal(); }
  void SetDefaultDeviceOrdinal(int64_t o) override { ts()->SetDefaultDeviceOrdinal(o); }
  at::DeviceType EagerFallbackDeviceType() const override { return ts()->EagerFallbackDeviceType(); }
  std::vector<lazy::BackendDevice> GetBackendDevices() const override { return ts()->GetBackendDevices(); }
  std::string CreateMetricReport() const override { return ts()->CreateMetricReport(); }
  lazy::BackendDevice GetBackendDevice(c10::Device device) const override { return ts()->GetBackendDevice(device); }
  std::string GetComputationBackendText(const lazy::ComputationPtr computation) const override {
    return ts()->GetComputationBackendText(computation);
  }

 private:
  // A graph XLA did not take: its device arguments downloaded, run by the TorchScript
  // interpreter, its results and the arguments it updated in place uploaded.
  std::vector<lazy::BackendDataPtr> execute_on_torchscript(lazy::ComputationPtr computation,
                                                           c10::ArrayRef<lazy::BackendDataPtr> arguments,
                                                           const lazy::BackendDevice& device) const {
    std::vector<lazy::BackendDataPtr> host_args;
    host_args.reserve(arguments.size());
    for (const auto& a : arguments) {
      if (dynamic_cast<const PjrtData*>(a.get())) {
        host_args.push_back(std::make_shared<lazy::TSData>(host_tensor(a), a->shape(), device));
      } else {
        host_args.push_back(a);
      }
    }
    std::vector<lazy::BackendDataPtr> results;
    for (const auto& r : ts()->ExecuteComputation(computation, host_args, device)) {
      const at::Tensor t = std::static_pointer_cast<lazy::TSData>(r)->data();
      results.push_back(std::make_shared<PjrtData>(upload(t), shape_of(t), device));
    }
    if (const auto* pc = dynamic_cast<const PjrtComputation*>(computation.get())) {
      for (size_t k : pc->updated_inputs) {
        if (auto p = std::dynamic_pointer_cast<PjrtData>(arguments[k]))
          p->set_buffer(upload(std::static_pointer_cast<lazy::TSData>(host_args[k])->data()));
      }
    }
    std::lock_guard<std::mutex> lock(metrics_mu);
    ++metrics_.fallback_executions;
    return results;
  }
};

// The lazy tensor behind `t` (unwrapped from functionalization), or null.
lazy::LazyTensorPtr lazy_tensor_of(const at::Tensor& t) {
  if (!t.defined()) return {};
  return lazy::TryGetLtcTensor(lazy::maybe_unwrap_functional(t));
}

// aten::_copy_from on lazy tensors, replacing libtorch's (LazyNativeFunctions::_copy_from), which
// assumes device data is host memory: copying a lazy tensor to the host keeps the downloaded
// value as the source's host tensor beside its device data, and a lazy-to-lazy copy into a tensor
// with no pending graph writes that host tensor only, so graphs went on reading the old PJRT
// buffer. Here the host copy is not kept, and a lazy-to-lazy copy becomes dst's graph value (as
// functionalization traces a copy_), so the next graph or read computes it. Tensors under
// functionalization's wrapper (every tensor the trainer moves) do not reach this kernel.
at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool /*non_blocking*/) {
  TORCH_LAZY_COUNTER("lazy::_copy_from", 1);  // libtorch's kernel's counter
  lazy::LazyTensorPtr to = lazy::TryGetLtcTensor(dst);
  lazy::LazyTensorPtr from = lazy::TryGetLtcTensor(self);
  if (!from) {
    to->UpdateFromTensor(self, /*sync=*/true);
  } else if (!to) {
    const at::Tensor value = from->ToTensor(/*detached=*/true);
    dst.resize_as_(value).copy_(value);
  } else {
    lazy::Value v = from->GetIrValue();
    if (from->dtype() != to->dtype()) v = lazy::MakeCast(v, to->dtype(), from->dtype());
    if (from->shape().Get().sizes() != to->shape().Get().sizes())
      v = lazy::MakeExpand(v, to->shape().Get().sizes().vec(), /*is_scalar_expand=*/false);
    to->SetIrValue(v);
    static_cast<lazy::LTCTensorImpl*>(dst.unsafeGetTensorImpl())->set_tensor(to);
  }
  return dst;
}

// Drops the dispatcher's warning that a kernel replaces libtorch's (the replacement is meant).
class QuietWarnings : public c10::WarningHandler {
 public:
  void process(const c10::Warning&) override {}
};

}  // namespace

namespace detail {

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

void install_pjrt_lazy_backend() {
  static std::once_flag once;
  std::call_once(once, [] {
    lazy::InitTorchScriptBackend();
    static PjrtBackendImpl impl;
    static lazy::BackendRegistrar registrar(&impl);  // the last registrar wins
    QuietWarnings quiet;
    c10::WarningUtils::WarningHandlerGuard guard(&quiet);
    static torch::Library lazy_kernels(torch::Library::IMPL, "aten", c10::DispatchKey::Lazy, __FILE__, __LINE__);
    lazy_kernels.impl("_copy_from", TORCH_FN(copy_from));
  });
}

PjrtBackendMetrics pjrt_backend_metrics() {
  std::lock_guard<std::mutex> lock(metrics_mu);
  return metrics_;
}

bool copy_device_value_to_host(const at::Tensor& tensor, const at::Tensor& dst) {
  const lazy::LazyTensorPtr lt = lazy_tensor_of(tensor);
  if (!lt || lt->CurrentIrValue() || lt->CurrentTensorData()) return false;
  const auto* p = dynamic_cast<const PjrtData*>(lt->CurrentDataHandle().get());
  if (!p || !p->buffer()) return false;
  if (!dst.is_cpu() || !dst.is_contiguous() || dst.scalar_type() != p->shape().scalar_type() ||
      dst.numel() != static_cast<int64_t>(p->shape().numel()))
    throw std::invalid_argument("copy_device_value_to_host: the destination (" + std::string(c10::toString(dst.scalar_type())) +
                                ", " + std::to_string(dst.numel()) + " elements, contiguous CPU required) does not fit " +
                                p->shape().to_string());
  p->buffer()->to_host(dst.data_ptr(), dst.nbytes());
  count_bytes(0, static_cast<int64_t>(dst.nbytes()));
  std::lock_guard<std::mutex> lock(metrics_mu);
  ++metrics_.one_copy_to_host;
  return true;
}

at::Tensor device_tensor_from_host(const at::Tensor& host, const c10::Device& device) {
  const lazy::BackendDevice bd = lazy::atenDeviceToBackendDevice(device);
  const at::Tensor c = host.contiguous();
  auto data = std::make_shared<PjrtData>(upload(c), shape_of(c), bd);
  {
    std::lock_guard<std::mutex> lock(metrics_mu);
    ++metrics_.one_copy_to_device;
  }
  return at::functionalization::impl::to_functional_tensor(lazy::CreateAtenFromLtcTensor(lazy::LazyTensor::Create(data)));
}

}  // namespace fulgur::xla
