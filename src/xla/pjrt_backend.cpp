// The lazy backend on PJRT; see pjrt_backend.h.

#include "xla/pjrt_backend.h"

#include "runtime/log.h"

#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/lazy/backend/backend_interface.h>
#include <torch/csrc/lazy/core/ir.h>
#include <torch/csrc/lazy/ts_backend/ts_backend_impl.h>
#include <torch/csrc/lazy/ts_backend/ts_lowering_context.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>

#include "xla/pjrt/client.h"
#include "xla/pjrt/tensors.h"
#include "xla/stablehlo/emitter.h"

namespace fulgur::xla {
namespace {

namespace lazy = torch::lazy;

std::mutex metrics_mu;
PjrtBackendMetrics metrics_;
std::set<std::string> warned_;

// A TorchScript computation that, when XLA compiled its graph, runs on PJRT instead.
class PjrtComputation : public lazy::TSComputation {
 public:
  PjrtComputation(const std::shared_ptr<torch::jit::Graph>& graph, std::shared_ptr<pjrt::Executable> exe)
      : lazy::TSComputation(graph), executable(std::move(exe)) {}
  std::shared_ptr<pjrt::Executable> executable;  // null: run by TorchScript
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

void note_fallback(const std::vector<std::string>& reasons) {
  std::lock_guard<std::mutex> lock(metrics_mu);
  ++metrics_.graphs_fallen_back;
  for (const auto& r : reasons) {
    ++metrics_.fallbacks[r];
    if (warned_.insert(r).second) {
      runtime::log_rank_zero(runtime::LogLevel::kWarning,
                             "xla (pjrt): a graph with " + r +
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
  bool ShouldSyncTensor(const lazy::LazyTensorPtr tensor) const override { return ts()->ShouldSyncTensor(tensor); }
  lazy::BackendDataPtr MakeComputationDataFromTensor(const at::Tensor& tensor, const lazy::Shape& shape,
                                                     const lazy::BackendDevice& device) const override {
    return ts()->MakeComputationDataFromTensor(tensor, shape, device);
  }
  lazy::BackendDataPtr MakeComputationDataFromScalar(const at::Scalar& scalar,
                                                     const lazy::BackendDevice& device) const override {
    return ts()->MakeComputationDataFromScalar(scalar, device);
  }
  lazy::BackendDataPtr CreateDataPlaceholder(const lazy::BackendDevice& device,
                                             const lazy::Shape& shape) const override {
    return ts()->CreateDataPlaceholder(device, shape);
  }
  lazy::BackendDataPtr GetComputationDataFromNode(lazy::Node* node) const override {
    return ts()->GetComputationDataFromNode(node);
  }
  at::Tensor MakeTensorFromComputationData(const lazy::BackendDataPtr data,
                                           c10::optional<at::ScalarType> logical_scalar_type) const override {
    return ts()->MakeTensorFromComputationData(data, logical_scalar_type);
  }

  std::unique_ptr<lazy::LoweringContext> CreateLoweringContext(const std::string& name, lazy::BackendDevice device,
                                                               c10::ArrayRef<lazy::Node*> post_order,
                                                               lazy::Util::EmissionMap emit_status) const override {
    auto ctx = ts()->CreateLoweringContext(name, device, post_order, emit_status);
    auto* tsctx = static_cast<lazy::TSLoweringContext*>(ctx.get());
    // Outputs: the lazy nodes' shapes.
    for (lazy::Node* node : post_order) {
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
      if (d->HasValue()) {
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
      try {
        stablehlo::Emission e = stablehlo::emit_stablehlo(*graph);
        if (e.unsupported.empty()) {
          exe = std::make_shared<pjrt::Executable>(pjrt::process_client().compile(e.module));
        } else {
          reasons = e.unsupported;
        }
      } catch (const std::exception& ex) {
        reasons = {std::string("a graph XLA could not take (") + ex.what() + ")"};
      }
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::shared_ptr<PjrtComputation> c;
      if (exe) {
        c = std::make_shared<PjrtComputation>(graph, std::move(exe));
        std::lock_guard<std::mutex> lock(metrics_mu);
        ++metrics_.graphs_compiled;
        metrics_.compile_seconds += dt;
      } else {
        note_fallback(reasons);
        c = std::make_shared<PjrtComputation>(untyped_copy(*graph), nullptr);
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
    if (!pc || !pc->executable) {
      {
        std::lock_guard<std::mutex> lock(metrics_mu);
        ++metrics_.fallback_executions;
      }
      return ts()->ExecuteComputation(computation, arguments, device);
    }
    auto& client = pjrt::process_client();
    std::vector<pjrt::Buffer> buffers;
    buffers.reserve(arguments.size());
    int64_t up = 0, down = 0;
    for (const auto& a : arguments) {
      auto d = std::static_pointer_cast<lazy::TSData>(a);
      at::Tensor t;
      if (d->scalar.has_value()) {
        const at::Scalar& s = *d->scalar;
        // The emitter's number inputs: a float is tensor<f64>, an int or bool tensor<i64>.
        t = s.isFloatingPoint() ? at::scalar_tensor(s.toDouble(), at::kDouble)
                                : at::scalar_tensor(s.toLong(), at::kLong);
      } else {
        t = d->data();
      }
      up += static_cast<int64_t>(t.nbytes());
      buffers.push_back(pjrt::to_device(client, t));
    }
    std::vector<const pjrt::Buffer*> args;
    for (const auto& b : buffers) args.push_back(&b);
    std::vector<pjrt::Buffer> outs = pc->executable->execute(args);
    std::vector<lazy::BackendDataPtr> results;
    results.reserve(outs.size());
    for (const auto& b : outs) {
      at::Tensor r = pjrt::to_tensor(b);
      down += static_cast<int64_t>(r.nbytes());
      lazy::Shape shape(r.scalar_type(), std::vector<int64_t>(r.sizes().begin(), r.sizes().end()));
      results.push_back(std::make_shared<lazy::TSData>(r, shape, device));
    }
    std::lock_guard<std::mutex> lock(metrics_mu);
    ++metrics_.executions;
    metrics_.bytes_to_device += up;
    metrics_.bytes_to_host += down;
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
};

}  // namespace

void install_pjrt_lazy_backend() {
  static std::once_flag once;
  std::call_once(once, [] {
    lazy::InitTorchScriptBackend();
    static PjrtBackendImpl impl;
    static lazy::BackendRegistrar registrar(&impl);  // the last registrar wins
  });
}

PjrtBackendMetrics pjrt_backend_metrics() {
  std::lock_guard<std::mutex> lock(metrics_mu);
  return metrics_;
}

}  // namespace fulgur::xla
