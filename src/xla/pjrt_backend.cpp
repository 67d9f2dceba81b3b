// SPDX-License-Identifier: Apache-2.0
// The lazy backend on PJRT; see pjrt_backend.h. Its device data are in pjrt_data.cpp, its
// lowering and compile in pjrt_compile.cpp; here are the BackendImplInterface that runs the
// compiled graphs, and the registration.

#include "xla/pjrt_backend.h"

#include <torch/csrc/lazy/backend/backend_interface.h>
#include <torch/csrc/lazy/core/ir_builder.h>
#include <torch/csrc/lazy/core/metrics.h>
#include <torch/csrc/lazy/core/tensor.h>
#include <torch/csrc/lazy/core/tensor_impl.h>
#include <torch/csrc/lazy/core/tensor_util.h>
#include <torch/csrc/lazy/ts_backend/ts_backend_impl.h>
#include <torch/library.h>
#include <torch/torch.h>

#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>

#include "xla/pjrt/client.h"
#include "xla/pjrt_compile.h"
#include "xla/pjrt_data.h"

namespace fulgur::xla {
namespace {

namespace lazy = torch::lazy;
using namespace detail;

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
    return make_lowering_context(name, std::move(device), post_order, std::move(emit_status));
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
    for (auto& instance : ts()->Compile(instances)) out.push_back(compile_computation(instance));
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
    std::lock_guard<std::mutex> lock(metrics_mutex());
    ++metrics().executions;
    metrics().buffers_donated += static_cast<int64_t>(donors.size());
    metrics().bytes_donated += donated_bytes;
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
    std::lock_guard<std::mutex> lock(metrics_mutex());
    ++metrics().fallback_executions;
    return results;
  }
};

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

}  // namespace fulgur::xla
