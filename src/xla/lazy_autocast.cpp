// SPDX-License-Identifier: Apache-2.0
// Autocast for lazy tensors; see lazy_autocast.h.
//
// Each listed op gets one boxed AutocastXLA kernel of its policy: it casts the op's floating-point
// lazy tensor arguments (tensors and tensor lists; float64 ones stay, as libtorch's autocast
// leaves them) to the policy's dtype, then calls the op again with AutocastXLA excluded, so that
// the call reaches the lazy kernels (and autograd records the casts: the backward converts each
// gradient back to its parameter's float32). Tensors on other devices pass unchanged; every
// other op falls through the key. The casts are not cached: each step's graph is traced anew,
// and a cast is one convert in it.

#include "xla/lazy_autocast.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <mutex>

namespace fulgur::xla::detail {
namespace {

constexpr c10::DispatchKey kKey = c10::DispatchKey::AutocastXLA;

bool eligible(const at::Tensor& t, c10::ScalarType to) {
  return t.defined() && t.device().type() == c10::kLazy && t.is_floating_point() && t.scalar_type() != to &&
         t.scalar_type() != c10::kDouble;
}

// Casts the eligible tensors among the arguments of `op` on `stack` to `to`.
void cast_arguments(const c10::OperatorHandle& op, torch::jit::Stack* stack, c10::ScalarType to) {
  const size_t n = op.schema().arguments().size();
  for (auto it = stack->end() - static_cast<std::ptrdiff_t>(n); it != stack->end(); ++it) {
    if (it->isTensor()) {
      if (eligible(it->toTensor(), to)) *it = it->toTensor().to(to);
    } else if (it->isTensorList()) {
      c10::List<at::Tensor> cast;
      for (const at::Tensor& t : it->toTensorList().vec()) cast.push_back(eligible(t, to) ? t.to(to) : t);
      *it = std::move(cast);
    }
  }
}

// Operands in the autocast dtype (bfloat16 for bf16-mixed).
void lower_precision(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(kKey);
  cast_arguments(op, stack, at::autocast::get_autocast_dtype(c10::DeviceType::XLA));
  op.callBoxed(stack);
}

// Operands in float32.
void float32(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(kKey);
  cast_arguments(op, stack, c10::kFloat);
  op.callBoxed(stack);
}

// libtorch's autocast lists for CUDA and CPU, cut to the ops a step of a zoo model meets.
constexpr const char* kLowerPrecision[] = {
    "mm", "bmm", "addmm", "baddbmm", "addbmm", "matmul", "linear", "conv1d", "conv2d", "conv3d", "conv1d.padding",
    "conv2d.padding", "conv3d.padding", "conv_transpose1d", "conv_transpose2d.input", "conv_transpose3d.input"};
constexpr const char* kFloat32[] = {
    "softmax.int", "log_softmax.int", "layer_norm", "group_norm", "batch_norm", "cross_entropy_loss", "nll_loss",
    "nll_loss_nd", "mse_loss", "smooth_l1_loss", "l1_loss", "huber_loss", "binary_cross_entropy",
    "binary_cross_entropy_with_logits", "kl_div", "sum", "sum.dim_IntList", "mean", "mean.dim", "exp", "log",
    "pow.Tensor_Scalar", "pow.Tensor_Tensor", "logsumexp", "cumsum", "norm.Scalar", "norm.ScalarOpt_dim",
    "linalg_vector_norm"};

void install_kernels() {
  static std::once_flag once;
  std::call_once(once, [] {
    static torch::Library fallthrough(torch::Library::IMPL, "_", kKey, __FILE__, __LINE__);
    fallthrough.fallback(torch::CppFunction::makeFallthrough());
    static torch::Library lib(torch::Library::IMPL, "aten", kKey, __FILE__, __LINE__);
    for (const char* op : kLowerPrecision) lib.impl(op, torch::CppFunction::makeFromBoxedFunction<&lower_precision>());
    for (const char* op : kFloat32) lib.impl(op, torch::CppFunction::makeFromBoxedFunction<&float32>());
  });
}

}  // namespace

LazyAutocastState enter_lazy_autocast(c10::ScalarType dtype) {
  install_kernels();
  const LazyAutocastState previous{c10::impl::tls_is_dispatch_key_included(kKey),
                                   at::autocast::is_autocast_enabled(c10::DeviceType::XLA),
                                   at::autocast::get_autocast_dtype(c10::DeviceType::XLA)};
  c10::impl::tls_set_dispatch_key_included(kKey, true);
  at::autocast::set_autocast_enabled(c10::DeviceType::XLA, true);
  at::autocast::set_autocast_dtype(c10::DeviceType::XLA, dtype);
  return previous;
}

void exit_lazy_autocast(const LazyAutocastState& previous) {
  c10::impl::tls_set_dispatch_key_included(kKey, previous.included);
  at::autocast::set_autocast_enabled(c10::DeviceType::XLA, previous.enabled);
  at::autocast::set_autocast_dtype(c10::DeviceType::XLA, previous.dtype);
}

}  // namespace fulgur::xla::detail
