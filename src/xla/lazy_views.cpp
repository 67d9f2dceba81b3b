// SPDX-License-Identifier: Apache-2.0
// Kernels on libtorch's Lazy dispatch key for ops its lazy core leaves to the eager fallback in a
// way that breaks: the recurrent modules (RNN, LSTM, GRU and their cells) of torch::nn aborted
// the process on an xla device.
//  - unsafe_split / unsafe_split_with_sizes (what unsafe_chunk calls; the cells split their gate
//    projections with it): functionalization treats them as plain ops and hands the Lazy key
//    the unwrapped tensors, whose split is made of slice views that a lazy tensor cannot hold
//    outside functionalization ("aten::as_strided appears to be a view operator"). Here each
//    piece is a slice_copy, which the lazy core lowers; an unsafe split promises no aliasing,
//    so copies keep its meaning.
//  - unbind_copy, split_copy, split_with_sizes_copy: functionalization regenerates an unbind or
//    split view (a sequence's time steps, chunk's pieces: MultiheadAttention's q, k, v) with
//    them, and the lazy core has no kernel for these ops that return lists: the eager fallback
//    returned CPU tensors, and the next op failed with "Input tensor is not a lazy tensor:
//    CPUFloatType". Here they are select_copy / slice_copy along the dimension.
// And ops the lazy core has no node for, which it ran eagerly on the host (an eager fallback per
// call, the data copied out of the device and back): clamp_max, argmax, min along a dim,
// mse_loss and its backward, composed here from ops it has nodes for and the StableHLO emitter lowers (clamp,
// max along a dim, arithmetic and sums), so that a regression loss or an accuracy metric stays
// in the step's XLA program.
// And copy, the functional form of copy_ that functionalization writes where a tensor is
// copied into (slice's and select's backwards copy the gradient into a zero tensor): the lazy
// core has no node for it and ran it on the host once per backward. Here it is src converted to
// self's dtype and device and expanded to self's shape (_to_copy and expand_copy, which the
// emitter lowers).
// And logical_and / logical_or: the lazy core has no node for them, and the in-place forms
// (clamp's backward calls logical_and_) failed outright, because functionalization first runs
// an in-place op on meta tensors and libtorch has no Meta kernel for logical_and.out or
// logical_or.out. Here the Meta kernels give the out tensor the broadcast shape, and the Lazy
// kernels are bitwise_and / bitwise_or of (x != 0), lowered ops.
// And where (torch.where, also what clamp's and smooth_l1_loss's backwards call), which the lazy
// core has no node for either and ran on the host: here it is an aten::where node of fulgur's
// (WhereNode), with its operands promoted to the result type and its shape broadcast, which the
// emitter lowers (rules/elementwise.cpp) and a graph kept on TorchScript runs as aten::where.
// And clamp with tensor bounds (clamp.Tensor, clamp_min.Tensor, clamp_max.Tensor), which the lazy
// core has no node for: here minimum(maximum(self, min), max), lowered ops that propagate NaN from
// any operand as libtorch's kernel does and give max where min > max.
// And scatter (scatter.src: what topk's and max's backwards write their gradient into zeros
// with; scatter.value: what scatter's own backward writes zeros with), which the lazy core has
// no node for: here an aten::scatter node of fulgur's (ScatterNode), lowered to a
// stablehlo.scatter (rules/index.cpp).
// And equal (torch::equal; libtorch's C++ MultiheadAttention compares query, key and value with
// it to choose its projection path), which the eager fallback ran by copying both tensors to the
// host: here the sizes are compared on the host and the values on the device (all(eq)), and
// only the resulting bool is read back. Reading it still runs the graph traced so far (the step
// is cut there); docs/GUIDE.md says how MultiheadAttention's self-attention avoids it.
// The results are the eager kernels' (tests/test_modules.cpp runs the modules against eager,
// tests/xla_rules/ each op, with nothing left on the host).

#include "xla/lazy_views.h"

#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <ATen/WrapDimUtils.h>
#include <ATen/core/Reduction.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/lazy/core/tensor.h>
#include <torch/csrc/lazy/ts_backend/ts_node.h>
#include <torch/csrc/lazy/ts_backend/ts_node_lowering.h>
#include <torch/library.h>

#include <mutex>

namespace fulgur::xla::detail {
namespace {

std::vector<at::Tensor> split_copies(const at::Tensor& self, const std::vector<int64_t>& sizes, int64_t dim) {
  std::vector<at::Tensor> out;
  out.reserve(sizes.size());
  int64_t start = 0;
  for (int64_t n : sizes) {
    out.push_back(at::slice_copy(self, dim, start, start + n, 1));
    start += n;
  }
  return out;
}

// split(split_size): pieces of split_size along dim, the last one shorter (one empty piece of
// an empty dimension), as at::split.
std::vector<at::Tensor> split_size_copies(const at::Tensor& self, c10::SymInt split_size, int64_t dim) {
  dim = c10::maybe_wrap_dim(dim, self.dim());
  const int64_t size = self.size(dim), step = split_size.expect_int();
  TORCH_CHECK(step > 0 || size == 0, "split: split_size must be positive, got ", step);
  std::vector<int64_t> sizes;
  for (int64_t start = 0; start < size || (size == 0 && sizes.empty()); start += std::max<int64_t>(step, 1))
    sizes.push_back(std::min(step, size - start));
  return split_copies(self, sizes, dim);
}

std::vector<at::Tensor> split_sizes_copies(const at::Tensor& self, c10::SymIntArrayRef split_sizes, int64_t dim) {
  dim = c10::maybe_wrap_dim(dim, self.dim());
  std::vector<int64_t> sizes;
  int64_t total = 0;
  for (const auto& s : split_sizes) {
    sizes.push_back(s.expect_int());
    total += sizes.back();
  }
  TORCH_CHECK(total == self.size(dim), "split_with_sizes: the sizes sum to ", total, ", the dimension has ",
              self.size(dim));
  return split_copies(self, sizes, dim);
}

std::vector<at::Tensor> unbind_copy(const at::Tensor& self, int64_t dim) {
  dim = c10::maybe_wrap_dim(dim, self.dim());
  std::vector<at::Tensor> out;
  out.reserve(static_cast<size_t>(self.size(dim)));
  for (int64_t i = 0; i < self.size(dim); ++i) out.push_back(at::select_copy(self, dim, i));
  return out;
}

at::Tensor clamp_max(const at::Tensor& self, const at::Scalar& max) { return at::clamp(self, std::nullopt, max); }

// The first index of the largest value (the first NaN, where there is one), as at::max along a
// dimension gives it; over the whole tensor when dim is not given.
at::Tensor argmax(const at::Tensor& self, std::optional<int64_t> dim, bool keepdim) {
  // Views have no place on the Lazy key (functionalization is above it): view_copy.
  if (dim) return std::get<1>(at::max(self, *dim, keepdim));
  at::Tensor index = std::get<1>(at::max(at::view_copy(self, {-1}), 0, false));
  return keepdim ? at::view_copy(index, std::vector<int64_t>(static_cast<size_t>(self.dim()), 1)) : index;
}

// min along a dim, as max along it of the values in reversed order: -x for floats (NaN stays
// NaN, so the first NaN still wins), -x - 1 in int64 for integers and bool (~x in two's
// complement, which wraps without overflow at the lowest value). The first index of ties, as
// at::min gives it.
std::tuple<at::Tensor, at::Tensor> min_dim(const at::Tensor& self, int64_t dim, bool keepdim) {
  const bool floating = at::isFloatingType(self.scalar_type());
  auto reversed = [&](const at::Tensor& t) { return floating ? at::neg(t) : at::neg(t) - 1; };
  auto [values, indices] = at::max(reversed(floating ? self : self.to(at::kLong)), dim, keepdim);
  return {reversed(values).to(self.scalar_type()), indices};
}

at::Tensor mse_loss(const at::Tensor& self, const at::Tensor& target, int64_t reduction) {
  const at::Tensor diff = self - target;
  const at::Tensor sq = diff * diff;
  if (reduction == at::Reduction::Mean) return sq.mean();
  if (reduction == at::Reduction::Sum) return sq.sum();
  return sq;
}

at::Tensor mse_loss_backward(const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target,
                             int64_t reduction) {
  const double scale = reduction == at::Reduction::Mean ? 2.0 / static_cast<double>(self.numel()) : 2.0;
  return (self - target) * grad_output * scale;
}

// copy(self, src): a new tensor of self's shape, dtype and device holding src broadcast.
at::Tensor copy(const at::Tensor& self, const at::Tensor& src, bool non_blocking) {
  at::Tensor s = src.to(self.device(), self.scalar_type(), non_blocking);
  return at::expand_copy(s, self.sizes());
}

// The Meta kernels of logical_and.out and logical_or.out: the out tensor resized to the
// broadcast shape (its dtype is the caller's).
at::Tensor& logical_out_meta(const at::Tensor& self, const at::Tensor& other, at::Tensor& out) {
  out.resize_(at::infer_size(self.sizes(), other.sizes()));
  return out;
}

at::Tensor logical_and(const at::Tensor& self, const at::Tensor& other) {
  return at::bitwise_and(at::ne(self, 0), at::ne(other, 0));
}
at::Tensor logical_or(const at::Tensor& self, const at::Tensor& other) {
  return at::bitwise_or(at::ne(self, 0), at::ne(other, 0));
}

namespace lazy = torch::lazy;

// aten::where(condition, self, other) of operands already of the result's dtype (the condition
// bool); the result broadcast to `shape`.
class WhereNode : public lazy::TsNode {
 public:
  WhereNode(const lazy::Value& condition, const lazy::Value& self, const lazy::Value& other, const lazy::Shape& shape)
      : lazy::TsNode(lazy::OpKind(at::aten::where), {condition, self, other}, std::vector<lazy::Shape>{shape}, 1,
                     lazy::MHash(shape.sizes().vec(), static_cast<int>(shape.scalar_type()))) {}

  lazy::TSOpVector Lower(std::shared_ptr<torch::jit::GraphFunction> function,
                         lazy::TSLoweringContext* loctx) const override {
    std::vector<torch::jit::NamedValue> args;
    for (size_t i = 0; i < 3; ++i) args.emplace_back(loctx->GetOutputOp(operand(i)));
    return lazy::LowerTSBuiltin(function, op().op, args);
  }
};

at::Tensor where(const at::Tensor& condition, const at::Tensor& self, const at::Tensor& other) {
  TORCH_CHECK(condition.scalar_type() == at::kBool || condition.scalar_type() == at::kByte,
              "where expected condition to be a boolean tensor, but got a tensor with dtype ",
              c10::toString(condition.scalar_type()));
  const at::ScalarType t = at::result_type(self, other);
  c10::Device device = condition.device();
  for (const at::Tensor* x : {&condition, &self, &other})
    if (x->device().is_lazy()) device = x->device();
  const lazy::BackendDevice lazy_device = lazy::atenDeviceToBackendDevice(device);
  // The operand's IR value in `dtype`: a wrapped number becomes a constant, a 0-d CPU tensor is
  // copied to the device (torch.where takes CPU scalars beside device tensors).
  auto value = [&](const at::Tensor& x, at::ScalarType dtype) {
    at::Tensor y = x.scalar_type() == dtype ? x : x.to(dtype);
    lazy::LazyTensorPtr l = lazy::GetLtcTensorOrCreateForWrappedNumber(y, lazy_device);
    if (!l) l = lazy::GetLtcTensor(y.to(device));
    return l->GetIrValue();
  };
  const std::vector<int64_t> sizes = at::infer_size(at::infer_size(condition.sizes(), self.sizes()), other.sizes());
  const lazy::Shape shape(t, sizes);
  lazy::NodePtr node = std::make_shared<WhereNode>(value(condition, at::kBool), value(self, t), value(other, t), shape);
  return lazy::CreateAtenFromLtcTensor(lazy::LazyTensor::Create(lazy::Value(node, 0), lazy_device));
}

// clamp.Tensor: at least one bound, as libtorch requires.
at::Tensor clamp_tensor(const at::Tensor& self, const std::optional<at::Tensor>& min,
                        const std::optional<at::Tensor>& max) {
  const bool has_min = min && min->defined(), has_max = max && max->defined();
  TORCH_CHECK(has_min || has_max, "torch.clamp: At least one of 'min' or 'max' must not be None");
  at::Tensor out = has_min ? at::maximum(self, *min) : self;
  return has_max ? at::minimum(out, *max) : out;
}
at::Tensor clamp_min_tensor(const at::Tensor& self, const at::Tensor& min) { return at::maximum(self, min); }
at::Tensor clamp_max_tensor(const at::Tensor& self, const at::Tensor& max) { return at::minimum(self, max); }

// aten::scatter(self, dim, index, src): self with src[i] written at index[i] along dim (src's
// leading part of index's shape), the result of self's shape and dtype.
class ScatterNode : public lazy::TsNode {
 public:
  ScatterNode(const lazy::Value& self, int64_t dim, const lazy::Value& index, const lazy::Value& src,
              const lazy::Shape& shape)
      : lazy::TsNode(lazy::OpKind(at::aten::scatter), {self, index, src}, std::vector<lazy::Shape>{shape}, 1,
                     lazy::MHash(dim)),
        dim_(dim) {}

  lazy::TSOpVector Lower(std::shared_ptr<torch::jit::GraphFunction> function,
                         lazy::TSLoweringContext* loctx) const override {
    std::vector<torch::jit::NamedValue> args;
    args.emplace_back(loctx->GetOutputOp(operand(0)));
    args.emplace_back(dim_);
    args.emplace_back(loctx->GetOutputOp(operand(1)));
    args.emplace_back(loctx->GetOutputOp(operand(2)));
    return lazy::LowerTSBuiltin(function, op().op, args);
  }

 private:
  int64_t dim_;
};

at::Tensor scatter_src(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& src) {
  dim = c10::maybe_wrap_dim(dim, self.dim());
  TORCH_CHECK(index.scalar_type() == at::kLong, "scatter(): Expected dtype int64 for index, got ",
              c10::toString(index.scalar_type()));
  TORCH_CHECK(index.dim() == self.dim() && src.dim() == self.dim(),
              "scatter(): Index tensor must have the same number of dimensions as self and src, got ", index.dim(),
              ", ", self.dim(), " and ", src.dim());
  for (const at::Tensor* x : {&index, &src})
    TORCH_CHECK(x->device() == self.device(), "scatter(): expected index and src on ", self.device(), " as self, got ",
                x->device());
  const lazy::BackendDevice device = lazy::atenDeviceToBackendDevice(self.device());
  auto value = [](const at::Tensor& x) { return lazy::GetLtcTensor(x)->GetIrValue(); };
  const at::Tensor s = src.scalar_type() == self.scalar_type() ? src : src.to(self.scalar_type());
  const lazy::Shape shape(self.scalar_type(), self.sizes().vec());
  lazy::NodePtr node = std::make_shared<ScatterNode>(value(self), dim, value(index), value(s), shape);
  return lazy::CreateAtenFromLtcTensor(lazy::LazyTensor::Create(lazy::Value(node, 0), device));
}

// scatter.value (scatter's backward writes zeros over the gradient with it): scatter.src of a
// tensor of the value, of index's shape.
at::Tensor scatter_value(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Scalar& value) {
  return scatter_src(self, dim, index, at::full(index.sizes(), value, self.options()));
}

// torch::equal: the same sizes (known on the host) and all elements equal (NaN is not equal to
// itself), the latter computed on the device and read back as one bool.
bool equal(const at::Tensor& self, const at::Tensor& other) {
  if (!self.is_same_size(other)) return false;
  if (self.numel() == 0) return true;
  return at::all(at::eq(self, other)).item<bool>();
}

}  // namespace

void install_lazy_view_kernels() {
  static std::once_flag once;
  std::call_once(once, [] {
    static torch::Library lib(torch::Library::IMPL, "aten", c10::DispatchKey::Lazy, __FILE__, __LINE__);
    lib.impl("unsafe_split.Tensor", TORCH_FN(split_size_copies));
    lib.impl("unsafe_split_with_sizes", TORCH_FN(split_sizes_copies));
    lib.impl("split_copy.Tensor", TORCH_FN(split_size_copies));
    lib.impl("split_with_sizes_copy", TORCH_FN(split_sizes_copies));
    lib.impl("unbind_copy.int", TORCH_FN(unbind_copy));
    lib.impl("clamp_max", TORCH_FN(clamp_max));
    lib.impl("argmax", TORCH_FN(argmax));
    lib.impl("min.dim", TORCH_FN(min_dim));
    lib.impl("mse_loss", TORCH_FN(mse_loss));
    lib.impl("mse_loss_backward", TORCH_FN(mse_loss_backward));
    lib.impl("where.self", TORCH_FN(where));
    lib.impl("copy", TORCH_FN(copy));
    lib.impl("logical_and", TORCH_FN(logical_and));
    lib.impl("logical_or", TORCH_FN(logical_or));
    lib.impl("clamp.Tensor", TORCH_FN(clamp_tensor));
    lib.impl("clamp_min.Tensor", TORCH_FN(clamp_min_tensor));
    lib.impl("clamp_max.Tensor", TORCH_FN(clamp_max_tensor));
    lib.impl("scatter.src", TORCH_FN(scatter_src));
    lib.impl("scatter.value", TORCH_FN(scatter_value));
    lib.impl("equal", TORCH_FN(equal));
    static torch::Library meta(torch::Library::IMPL, "aten", c10::DispatchKey::Meta, __FILE__, __LINE__);
    meta.impl("logical_and.out", TORCH_FN(logical_out_meta));
    meta.impl("logical_or.out", TORCH_FN(logical_out_meta));
  });
}

}  // namespace fulgur::xla::detail
