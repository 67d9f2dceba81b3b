// SPDX-License-Identifier: Apache-2.0
// One lazy IR node per parameter for Adam's update; see lazy_adam.h.

#include "xla/lazy_adam.h"

#include "xla/updated_data.h"

#include <ATen/FunctionalTensorWrapper.h>
#include <c10/core/TensorImpl.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/lazy/core/lazy_graph_executor.h>
#include <torch/csrc/lazy/core/tensor.h>
#include <torch/csrc/lazy/core/tensor_util.h>
#include <torch/csrc/lazy/ts_backend/ts_backend_impl.h>
#include <torch/csrc/lazy/ts_backend/ts_node.h>
#include <torch/csrc/lazy/ts_backend/ts_node_lowering.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace fulgur::xla {
namespace {

namespace lazy = torch::lazy;
namespace functionalization = at::functionalization::impl;

using Decay = AdamNumbers::Decay;

// Operands of the node, in this order; kDecay only when the update decays.
enum Operand : size_t {
  kParam,
  kGrad,
  kExpAvg,
  kExpAvgSq,
  kBeta1,
  kOneMinusBeta1,
  kBeta2,
  kOneMinusBeta2,
  kBias2Sqrt,
  kEps,
  kNegStepSize,
  kDecay,
};

const lazy::OpKind& adam_kind() {
  static const lazy::OpKind kind = lazy::OpKind::Get("fulgur::adam_update");
  return kind;
}

class AdamNode : public lazy::TsNode {
 public:
  AdamNode(lazy::OpList operands, const lazy::Shape& shape, Decay decay)
      : lazy::TsNode(adam_kind(), operands, std::vector<lazy::Shape>{shape, shape, shape}, 3,
                     lazy::MHash(static_cast<int>(decay))),
        decay_(decay) {}

  std::string ToString() const override {
    const char* d = decay_ == Decay::none ? "none" : decay_ == Decay::adam ? "adam" : "adamw";
    return lazy::TsNode::ToString() + ", decay=" + d;
  }

  // libtorch 1.13's Adam::step (AdamW::step) for one parameter, op for op:
  //   [adamw] p = p * (1 - lr * wd)          [adam] g = g + wd * p
  //   m = m * b1 + (1 - b1) * g              v = v * b2 + (1 - b2) * g * g
  //   denom = sqrt(v) / sqrt(bc2) + eps      p = p + (-step_size) * m / denom
  lazy::TSOpVector Lower(std::shared_ptr<torch::jit::GraphFunction> function,
                         lazy::TSLoweringContext* loctx) const override {
    // The PJRT backend's emitter needs every value typed; the lowering context types the
    // node's outputs, these types are the intermediates'. The TorchScript backend's graphs
    // stay untyped, as its own lowerings make them.
    const bool typed = lazy::getBackend() != lazy::GetTSBackendImpl();
    const lazy::Shape& s = shape(0);
    auto in = [&](size_t i) { return loctx->GetOutputOp(operand(i)); };
    auto call = [&](const char* op, std::vector<torch::jit::NamedValue> args,
                    std::vector<torch::jit::NamedValue> kwargs = {}) {
      torch::jit::Value* v =
          lazy::LowerTSBuiltin(function, c10::Symbol::fromQualString(op), args, kwargs).front();
      if (typed) v->setType(c10::TensorType::createContiguous(s.scalar_type(), c10::kCPU, s.sizes()));
      return v;
    };
    torch::jit::Value* p = in(kParam);
    torch::jit::Value* g = in(kGrad);
    if (decay_ == Decay::adamw) p = call("aten::mul", {p, in(kDecay)});
    if (decay_ == Decay::adam) g = call("aten::add", {g, p}, {{"alpha", in(kDecay)}});
    torch::jit::Value* m =
        call("aten::add", {call("aten::mul", {in(kExpAvg), in(kBeta1)}), g}, {{"alpha", in(kOneMinusBeta1)}});
    torch::jit::Value* v = call("aten::addcmul", {call("aten::mul", {in(kExpAvgSq), in(kBeta2)}), g, g},
                                {{"value", in(kOneMinusBeta2)}});
    torch::jit::Value* denom = call("aten::add", {call("aten::div", {call("aten::sqrt", {v}), in(kBias2Sqrt)}), in(kEps)});
    torch::jit::Value* updated = call("aten::addcdiv", {p, m, denom}, {{"value", in(kNegStepSize)}});
    return {updated, m, v};
  }

 private:
  Decay decay_;
};

// The lazy tensor a (functionalized) tensor holds, its pending view updates applied.
lazy::LazyTensorPtr lazy_tensor(const at::Tensor& t) {
  if (functionalization::isFunctionalTensor(t)) functionalization::sync(t);
  return lazy::TryGetLtcTensor(lazy::maybe_unwrap_functional(t));
}

// Makes `value` the tensor's new value, as an in-place op does. Functionalization puts a new
// lazy tensor under the wrapper. With `in_place`, the old value's device data is marked with the
// node output that computes the new one (UpdatedBy), so that the PJRT lowering aliases the two
// and XLA can update the buffer in place: for Adam's state, which only its update reads. A weight
// is read by the forward and backward too, and aliasing it made XLA copy it (slower on the MNIST
// CNN). Keeping the old lazy tensor and setting its IR value instead reorders the graph's
// outputs, which made the CNN's step slower too (bench/history/libtorch-1.13.md).
void assign(const at::Tensor& t, lazy::Value value, const lazy::BackendDevice& device, bool in_place) {
  if (functionalization::isFunctionalTensor(t)) {
    const lazy::LazyTensorPtr before = lazy::TryGetLtcTensor(functionalization::from_functional_tensor(t));
    const lazy::BackendDataPtr old = before ? before->CurrentDataHandle() : nullptr;
    if (old && in_place) old->SetInfo(std::make_shared<UpdatedBy>(value));
    const lazy::LazyTensorPtr updated = lazy::LazyTensor::Create(std::move(value), device);
    functionalization::replace_(t, lazy::CreateAtenFromLtcTensor(updated));
    functionalization::commit_update(t);
    functionalization::sync(t);
  } else {
    lazy::TryGetLtcTensor(t)->SetIrValue(std::move(value));
  }
  t.unsafeGetTensorImpl()->bump_version();
}

}  // namespace

struct LazyAdamStep::Numbers {
  // A number's device data, made once per value per step; its value is not part of any graph's
  // hash, so steps whose numbers change (the bias corrections) share one compiled graph.
  lazy::Value get(double x, const lazy::BackendDevice& device) {
    uint64_t bits = 0;
    std::memcpy(&bits, &x, sizeof bits);
    auto it = values.find(bits);
    if (it == values.end())
      it = values.emplace(bits, lazy::LazyGraphExecutor::Get()->GetIrValueForScalarFromCodegen(at::Scalar(x), device))
               .first;
    return it->second;
  }
  std::map<uint64_t, lazy::Value> values;
};

bool lazy_adam_takes(const at::Tensor& like, const at::Tensor& t) {
  if (!like.defined() || !t.defined() || like.device().type() != c10::kLazy || t.device() != like.device()) return false;
  if (t.layout() != at::kStrided || like.layout() != at::kStrided || !t.is_floating_point()) return false;
  if (t.scalar_type() != like.scalar_type() || t.sizes() != like.sizes()) return false;
  // Without lazy_tensor()'s sync: this check runs for every tensor of every step, update() syncs.
  auto holds_lazy = [](const at::Tensor& x) { return lazy::TryGetLtcTensor(lazy::maybe_unwrap_functional(x)) != nullptr; };
  return holds_lazy(like) && holds_lazy(t);
}

LazyAdamStep::LazyAdamStep() : numbers_(std::make_unique<Numbers>()) {}
LazyAdamStep::~LazyAdamStep() = default;

void LazyAdamStep::update(const at::Tensor& p, const at::Tensor& grad, const at::Tensor& exp_avg,
                          const at::Tensor& exp_avg_sq, const AdamNumbers& n) {
  const lazy::LazyTensorPtr lp = lazy_tensor(p);
  const lazy::BackendDevice& device = lp->GetDevice();
  std::vector<lazy::Value> operands = {lp->GetIrValue(),
                                       lazy_tensor(grad)->GetIrValue(),
                                       lazy_tensor(exp_avg)->GetIrValue(),
                                       lazy_tensor(exp_avg_sq)->GetIrValue(),
                                       numbers_->get(n.beta1, device),
                                       numbers_->get(n.one_minus_beta1, device),
                                       numbers_->get(n.beta2, device),
                                       numbers_->get(n.one_minus_beta2, device),
                                       numbers_->get(n.bias_correction2_sqrt, device),
                                       numbers_->get(n.eps, device),
                                       numbers_->get(n.neg_step_size, device)};
  if (n.decay != Decay::none) operands.push_back(numbers_->get(n.decay_value, device));
  const lazy::Shape shape(p.scalar_type(), p.sizes());
  lazy::NodePtr node = std::make_shared<AdamNode>(operands, shape, n.decay);
  assign(p, lazy::Value(node, 0), device, /*in_place=*/false);
  assign(exp_avg, lazy::Value(node, 1), device, /*in_place=*/true);
  assign(exp_avg_sq, lazy::Value(node, 2), device, /*in_place=*/true);
}

}  // namespace fulgur::xla
